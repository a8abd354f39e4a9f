# edgelimit — the two commands a newcomer needs are `make run` and `make test`.
GO      ?= go
BIN     := bin/edgelimit
RULES   ?= deploy/examples/rules.yaml
LISTEN  ?= 127.0.0.1:8080
DATA    ?= ./data
SHELL   := /bin/bash

.PHONY: build run test bench lint fuzz load lab soak clean proto verify-proto proto-into

build:
	$(GO) build -o $(BIN) ./cmd/edgelimit

## run: a PoP on embedded defaults with the sample rules, on $(LISTEN)
run: build
	./$(BIN) pop --rules $(RULES) --listen $(LISTEN) --data $(DATA)

## test: every test, with the race detector; what it needs, and what it skips without, is in README.md.
## Prints what go test prints, and a line for each skipped test with its reason (cmd/testlog).
test:
	set -o pipefail; $(GO) test -race -timeout 15m -json ./... | $(GO) run ./cmd/testlog

## bench: the in-process benchmarks (docs/performance.md has the HTTP load figures)
bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

## lint: formatting, vet, and the generated protobuf code being up to date
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "not gofmt-formatted:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	@$(MAKE) --no-print-directory verify-proto

# The protobuf generators are pinned, so that every machine generates the same bytes:
#   protoc        libprotoc 3.21.12, Debian bookworm's package protobuf-compiler 3.21.12-3+deb12u1
#                 (apt-get install protobuf-compiler)
#   protoc-gen-go v1.36.12, a tool dependency in go.mod
#                 (go get -tool google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12; run as `go tool protoc-gen-go`)
PROTOC         ?= protoc
PROTOC_VERSION := libprotoc 3.21.12
PROTO_FILES    := proto/edgelimit.proto
# protoc-run DIR: generate the Go code of $(PROTO_FILES) into DIR, after checking protoc is there and pinned.
define protoc-run
	@command -v $(PROTOC) >/dev/null 2>&1 || { echo "protoc not found: install Debian's protobuf-compiler ($(PROTOC_VERSION)): apt-get install protobuf-compiler" >&2; exit 1; }
	@v=$$($(PROTOC) --version); if [ "$$v" != "$(PROTOC_VERSION)" ]; then echo "protoc is '$$v', want '$(PROTOC_VERSION)' (Debian bookworm's protobuf-compiler): the generated code names the protoc version, so another version makes it differ" >&2; exit 1; fi
	@plugin=$$($(GO) tool -n protoc-gen-go) && \
	  $(PROTOC) -I proto --plugin=protoc-gen-go=$$plugin --go_out=$(1) --go_opt=paths=source_relative $(notdir $(PROTO_FILES))
endef

## proto: regenerate proto/*.pb.go from proto/*.proto (needs protoc, see above)
proto:
	$(call protoc-run,proto)

## verify-proto: fail when the committed proto/*.pb.go differ from what proto/*.proto generates
verify-proto:
	@set -e; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	$(MAKE) --no-print-directory PROTO_OUT="$$tmp" proto-into; \
	for f in $(PROTO_FILES:.proto=.pb.go); do \
	  if ! diff -u "$$f" "$$tmp/$$(basename $$f)" >"$$tmp/diff" 2>&1; then \
	    echo "$$f is stale: it differs from what $${f%.pb.go}.proto generates; run 'make proto' and commit the result:" >&2; \
	    head -40 "$$tmp/diff" >&2; exit 1; \
	  fi; \
	done; \
	echo "proto: generated code is up to date"

# proto-into: generate into $(PROTO_OUT); a helper of verify-proto.
proto-into:
	$(call protoc-run,$(PROTO_OUT))

## fuzz: a short run of every fuzz target
fuzz:
	$(GO) test -run '^$$' -fuzz FuzzCheck -fuzztime 30s ./pop/httpapi/
	$(GO) test -run '^$$' -fuzz FuzzLoad -fuzztime 30s ./pop/rules/
	$(GO) test -run '^$$' -fuzz FuzzDecodeFast -fuzztime 30s ./pop/httpapi/
	$(GO) test -run '^$$' -fuzz FuzzUnmarshal -fuzztime 30s ./proto/
	$(GO) test -run '^$$' -fuzz FuzzJoin -fuzztime 30s ./crdt/
	$(GO) test -run '^$$' -fuzz FuzzLocal -fuzztime 30s ./crdt/
	$(GO) test -run '^$$' -fuzz FuzzDecodeState -fuzztime 30s ./pop/limit/
	$(GO) test -run '^$$' -fuzz FuzzParseBeacon -fuzztime 30s ./replication/core/

## load: drive a running PoP (make run) with 64 connections for 10 s
load: build
	./$(BIN) load --url http://$(LISTEN) --domain api_platform --key remote_address -c 64 -d 10s

## lab: SCENARIO on real sites in network namespaces, beside the simulator (needs root; see deploy/lab/README.md)
SCENARIO ?= simulate/scenarios/partition.yaml
LAB_FLAGS ?=
lab:
	$(GO) run ./deploy/lab/cmd/lab -scenario $(SCENARIO) $(LAB_FLAGS)

## soak: 10 minutes of mixed load on 2 regions × 2 PoPs with PoP kill -9s, Redis and NATS restarts, and a
## ledger of every decision against the documented bounds; exits 1 on a violation (see deploy/soak/README.md)
SOAK_FLAGS ?=
soak:
	$(GO) run ./deploy/soak/cmd/soak -root . $(SOAK_FLAGS)

clean:
	rm -rf bin $(DATA)
