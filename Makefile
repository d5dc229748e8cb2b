# The two set-up commands of the README: `make demo` (the main job) and `make test`.
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: demo test lint install clean
install:
	@scripts/bootstrap.sh

demo:
	@scripts/bootstrap.sh
	$(VENV)/bin/hybrid-attention demo $(ARGS)

test:
	@scripts/bootstrap.sh test
	$(VENV)/bin/ruff check hybrid_attention tests benchmarks
	$(PY) -m pytest -q -n 2 $(PYTEST_ARGS)

lint:
	@scripts/bootstrap.sh test
	$(VENV)/bin/ruff check hybrid_attention tests benchmarks

clean:
	rm -rf $(VENV) build *.egg-info
