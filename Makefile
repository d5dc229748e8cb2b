# The two set-up commands of the README: `make demo` (the main job) and `make test`.
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: demo test lint install clean test-hf-oldest
install:
	@scripts/bootstrap.sh

demo:
	@scripts/bootstrap.sh
	$(VENV)/bin/hybrid-attention demo $(ARGS)

test:  # the train extra too: the TensorBoard and W&B tracking tests run, none skipped
	@scripts/bootstrap.sh test,eval,train
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q -n 2 $(PYTEST_ARGS)

lint:
	@scripts/bootstrap.sh test
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) build *.egg-info

# The model/generation tests again on the oldest supported transformers (5.17), overlaid on the same venv.
HF_OLDEST := 5.17.0
test-hf-oldest:
	@scripts/bootstrap.sh test,eval
	$(PY) -m pip install -q --target .venv/transformers-$(HF_OLDEST) "transformers==$(HF_OLDEST)"
	PYTHONPATH=.venv/transformers-$(HF_OLDEST) $(PY) -c "import transformers; print('transformers', transformers.__version__)"
	PYTHONPATH=.venv/transformers-$(HF_OLDEST) $(PY) -m pytest -q tests/models $(PYTEST_ARGS)
