# edgelimit — the two commands a newcomer needs are `make run` and `make test`.
GO      ?= go
BIN     := bin/edgelimit
RULES   ?= deploy/examples/rules.yaml
LISTEN  ?= 127.0.0.1:8080
DATA    ?= ./data

.PHONY: build run test bench lint fuzz load clean

build:
	$(GO) build -o $(BIN) ./cmd/edgelimit

## run: a PoP on embedded defaults with the sample rules, on $(LISTEN)
run: build
	./$(BIN) pop --rules $(RULES) --listen $(LISTEN) --data $(DATA)

## test: every test, with the race detector; needs redis-server and nginx (see .ci/run)
test:
	$(GO) test -race -timeout 15m ./...

## bench: the in-process benchmarks (see README for the HTTP load figures)
bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

## lint: formatting and vet
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "not gofmt-formatted:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

## fuzz: a short run of every fuzz target
fuzz:
	$(GO) test -run '^$$' -fuzz FuzzCheck -fuzztime 30s ./pop/httpapi/
	$(GO) test -run '^$$' -fuzz FuzzLoad -fuzztime 30s ./pop/rules/

## load: drive a running PoP (make run) with 64 connections for 10 s
load: build
	./$(BIN) load --url http://$(LISTEN) --domain api_platform --key remote_address -c 64 -d 10s

clean:
	rm -rf bin $(DATA)
