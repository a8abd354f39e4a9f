package deploy

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/edgelimit/edgelimit/pop/store/redistest"
	"github.com/edgelimit/edgelimit/replication"
)

// TestSystemdUnit checks deploy/systemd/edgelimit.service against the
// binary: the flags of ExecStart and the EDGELIMIT_* variables of
// Environment are `edgelimit pop` flags, and the config file it names is
// deploy/systemd/pop.yaml's place. Then it starts a PoP with pop.yaml as
// the unit would, overriding on the command line only what points at this
// machine's services (listen, data, store, NATS, rules): every other
// setting of the file is taken and validated by the binary for real, and
// the PoP must become ready, replicating.
func TestSystemdUnit(t *testing.T) {
	flags := popFlags(t)
	unit := readRepoFile(t, "deploy/systemd/edgelimit.service")
	var execStart []string
	for _, line := range strings.Split(unit, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), "=")
		if !ok || strings.HasPrefix(k, "#") {
			continue
		}
		switch k {
		case "ExecStart":
			execStart = strings.Fields(v)
		case "Environment":
			name, _, _ := strings.Cut(v, "=")
			if f := envFlag(name); f == "" || !slices.Contains(flags, f) {
				t.Errorf("Environment=%s sets no flag of edgelimit pop", v)
			}
		}
	}
	if len(execStart) < 2 || execStart[1] != "pop" {
		t.Fatalf("ExecStart %v does not run edgelimit pop", execStart)
	}
	for _, f := range flagsOf(execStart[2:]) {
		if !slices.Contains(flags, f) {
			t.Errorf("ExecStart passes --%s, which edgelimit pop does not have", f)
		}
	}
	if i := slices.Index(execStart, "--config"); i < 0 || execStart[i+1] != "/etc/edgelimit/pop.yaml" {
		t.Errorf("ExecStart %v does not read /etc/edgelimit/pop.yaml, the place of deploy/systemd/pop.yaml", execStart)
	}

	popYAML := readRepoFile(t, "deploy/systemd/pop.yaml")
	var settings map[string]any
	if err := yaml.Unmarshal([]byte(popYAML), &settings); err != nil {
		t.Fatal(err)
	}
	for k := range settings {
		if !slices.Contains(flags, k) || k == "config" {
			t.Errorf("pop.yaml sets %q, which is no flag of edgelimit pop", k)
		}
	}

	redis := redistest.Start(t)
	nats, err := replication.StartServer(replication.ServerConfig{Name: "nats", Dir: t.TempDir(), Port: -1,
		Domain: fmt.Sprint(settings["region"]), Anonymous: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nats.Shutdown)
	dir := t.TempDir()
	config := filepath.Join(dir, "pop.yaml")
	if err := os.WriteFile(config, []byte(popYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	listen := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	env := []string{"EDGELIMIT_DATA=" + filepath.Join(dir, "data")}
	seed := filepath.Join(natsKeys(t, fmt.Sprint(settings["topology"])), fmt.Sprint(settings["pop"])+".nk")
	startPoP(t, "pop", listen, env, "--config", config, "--rules", "examples/rules.yaml",
		"--store", redis.URL(), "--nats", nats.ClientURL(), "--nats-nkey", seed) // the unit's LoadCredential path
	samples, err := scrape(listen)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := metric(samples, "edgelimit_replication_stalled_sources"); err != nil {
		t.Errorf("the PoP of pop.yaml does not replicate: %v", err)
	}
	if _, err := metric(samples, "edgelimit_store_breaker_state"); err != nil {
		t.Errorf("the PoP of pop.yaml does not use Redis: %v", err)
	}
}
