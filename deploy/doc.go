// Package deploy holds what an operator deploys — the container image, the
// systemd unit, the NATS server configs, the Prometheus alerts, the compose
// file and the proxy examples — and the tests that run or check those very
// files, so that what ships is what was tested.
//
// It has no code of its own: its tests build the edgelimit binary (and a
// nats-server binary of the version go.mod names) and run them from the
// files here, with only the values an operator fills in (ports, directories,
// passwords) templated. What cannot run on a machine without a container
// runtime (the Dockerfile, compose.yaml) is checked statically against the
// binary's own flag set and the repository's files.
//
// It may import any package of the module; nothing imports it.
package deploy
