package lab

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"go.yaml.in/yaml/v3"

	"github.com/edgelimit/edgelimit/simulate"
)

// Build builds edgelimit and nats-server (the version go.mod names) from
// the module at root into dir, and returns their paths.
func Build(ctx context.Context, root, dir string) (edgelimit, natsServer string, err error) {
	edgelimit, natsServer = filepath.Join(dir, "edgelimit"), filepath.Join(dir, "nats-server")
	for bin, pkg := range map[string]string{edgelimit: "./cmd/edgelimit", natsServer: "github.com/nats-io/nats-server/v2"} {
		cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, pkg)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", "", fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
		}
	}
	return edgelimit, natsServer, nil
}

// WriteScenario writes sc as a scenario file `edgelimit sim` reads, and
// reads it back to check that it is the same scenario.
func WriteScenario(path string, sc simulate.Scenario) error {
	b, err := yaml.Marshal(sc)
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return err
	}
	back, err := simulate.LoadScenario(path)
	if err != nil {
		return fmt.Errorf("lab: the scenario written to %s does not load back: %w", path, err)
	}
	if back.Duration != sc.Duration || len(back.Regions) != len(sc.Regions) || len(back.Partitions) != len(sc.Partitions) {
		return fmt.Errorf("lab: the scenario written to %s loads back different", path)
	}
	return nil
}
