"""What every stage shares below them all: file I/O that survives a crash, the command-line conventions, and
the rules for who owns an output folder.

* `files`: one atomic write (text, JSON, bytes, a torch object, or a stream through a writer) with fsync
  and clean-up, and reads whose errors name the file and the option it came from.
* `cli`: the argument parser every command uses (dash and underscore spellings, defaults shown, usage
  line = the actual invocation).
* `outputs`: output-folder ownership (markers, locks, claims), atomic folder replacement and the option
  rules of the commands.

Imports nothing from skillnet: data_prep/ and training/ (and everything above them) import from here, so
neither has to import the other. torch is imported only by `files.atomic_torch_save`, when called.
"""
