# Two commands set everything up on a machine with Python 3.11 and pip:
#   make demo   installs cgc into .venv and runs the main job on the built-in examples
#   make test   installs the test extras and runs the whole suite (mypy, pytest, lit/filecheck)

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
EXAMPLES := build/examples
TARGET ?= wse2

.PHONY: demo test bench fuzz lint typecheck clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.test-installed: pyproject.toml $(VENV)/.installed
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

demo: $(VENV)/.installed
	$(BIN)/python examples/build_models.py --out $(EXAMPLES)
	@echo "== MLP, pipelined: every layer on its own rectangle of the $(TARGET) mesh"
	$(BIN)/cgc compile $(EXAMPLES)/mlp.onnx -o $(EXAMPLES)/mlp.cgc --mode pipelined \
		--target $(TARGET) --batch-size 8 --dump-ir $(EXAMPLES)/mlp-ir
	$(BIN)/cgc run $(EXAMPLES)/mlp.cgc --inputs $(EXAMPLES)/mlp.inputs.npz \
		--output $(EXAMPLES)/mlp.outputs.npz --stats-json $(EXAMPLES)/mlp.stats.json
	@echo "== CNN, weight streaming on 2 systems: weights stream from MemoryX layer by layer"
	$(BIN)/cgc compile $(EXAMPLES)/cnn.onnx -o $(EXAMPLES)/cnn.cgc --mode weight_streaming \
		--target $(TARGET) --batch-size 8 --num-csx 2
	$(BIN)/cgc run $(EXAMPLES)/cnn.cgc --inputs $(EXAMPLES)/cnn.inputs.npz \
		--stats-json $(EXAMPLES)/cnn.stats.json --trace $(EXAMPLES)/cnn.trace.json
	@echo "== transformer block, auto mode"
	$(BIN)/cgc compile $(EXAMPLES)/transformer.onnx -o $(EXAMPLES)/transformer.cgc \
		--target $(TARGET) --batch-size 8
	$(BIN)/cgc run $(EXAMPLES)/transformer.cgc --inputs $(EXAMPLES)/transformer.inputs.npz
	@echo "== training the MLP in weight-streaming mode on 2 systems"
	$(BIN)/cgc train $(EXAMPLES)/mlp_train.onnx --data $(EXAMPLES)/mlp_train.data.npz \
		--batch-size 32 --steps 24 --optimizer sgd --lr 0.05 --momentum 0.9 --num-csx 2 \
		--target $(TARGET) --model-dir $(EXAMPLES)/mlp_train_run
	@echo "== generation: the two-block GPT's tokens after two prompts, with a key-value cache"
	$(BIN)/cgc generate examples/tiny-gpt.yaml --prompt $(EXAMPLES)/tiny-gpt.prompt.npz \
		--max-new-tokens 8 --init-seed 0 --target $(TARGET) --output $(EXAMPLES)/tiny-gpt.tokens.npz \
		--jsonl $(EXAMPLES)/tiny-gpt.steps.jsonl --artifact $(EXAMPLES)/tiny-gpt.generation.cgc
	@echo "== serving Llama 3.1 8B: time to first token, time per token, the cache's capacity"
	$(BIN)/cgc generate zoo:llama-3.1-8b --timing-only --prompt-len 2048 --max-new-tokens 512 \
		--mode whole_wafer --target $(TARGET) --stats-json $(EXAMPLES)/llama-3.1-8b.serving.json
	@echo "== GPT-3 175B from its params file on 64 wse2 systems: a step's time, no weights held"
	$(BIN)/cgc train zoo:gpt3-175b --timing-only --num-csx 64 --steps 1 \
		--model-dir $(EXAMPLES)/gpt3_175b_run --trace $(EXAMPLES)/gpt3_175b.trace.json

# every part runs whatever another's result; the target fails at the end if any part failed;
# pytest runs the test files on two workers (a file's tests together, as they share fixtures)
test: $(VENV)/.test-installed
	@failed=""; \
	$(BIN)/mypy || failed="$$failed mypy"; \
	$(BIN)/pytest -n 2 --dist loadfile || failed="$$failed pytest"; \
	$(BIN)/lit -q tests/filecheck || failed="$$failed lit"; \
	if [ -n "$$failed" ]; then echo "make test: failed:$$failed" >&2; exit 1; fi

typecheck: $(VENV)/.test-installed
	$(BIN)/mypy

bench: $(VENV)/.test-installed
	$(BIN)/python benchmarks/bench_run.py
	$(BIN)/python benchmarks/bench_compile.py
	$(BIN)/python benchmarks/bench_pipeline.py
	$(BIN)/python benchmarks/bench_scale.py
	$(BIN)/python benchmarks/bench_torch.py --repeat 1
	$(BIN)/python benchmarks/bench_torch_training.py
	$(BIN)/python benchmarks/validation.py

# the long fuzzing run (3,000+ cases over every family of cgc.tools.fuzz: ONNX files,
# artifacts, options, aliased paths, special files, full disks, concurrent runs, hostile params
# files, factories, edge values); bad cases kept in build/fuzz-cases with a replay.sh each, the
# report in build/fuzz.json
fuzz: $(VENV)/.test-installed
	$(BIN)/python benchmarks/fuzz.py --cases 3000 --json build/fuzz.json --keep build/fuzz-cases

lint: typecheck
	$(BIN)/ruff check cgc tests examples benchmarks
	$(BIN)/ruff format --check cgc tests examples benchmarks

clean:
	rm -rf build $(VENV) .pytest_cache
