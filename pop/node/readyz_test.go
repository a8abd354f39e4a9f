package node

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// /readyz names replication once: the replication package's errors already
// begin with "replication:", and the node adds it only to those that do not
// (catching up on the stream). Before, every replication reason read
// "replication: replication: …".
func TestReadyzReplicationReason(t *testing.T) {
	for _, tc := range []struct{ err, want string }{
		{"replication: the hub refuses this region's leaf link", "\"replication: the hub refuses this region's leaf link\""},
		{"catching up on the stream", "\"replication: catching up on the stream\""},
	} {
		dir := t.TempDir()
		file := filepath.Join(dir, "rules.yaml")
		os.WriteFile(file, []byte(rulesFile("2")), 0o644)
		repl := func(ctx context.Context, h ReplicaHooks) (func() error, func() error, error) {
			return func() error { <-ctx.Done(); return nil }, func() error { return errors.New(tc.err) }, nil
		}
		base, cancel, done := start(t, Config{Rules: []string{file}, DataDir: filepath.Join(dir, "data"), Replica: "a", Region: "eu", Replicate: repl})
		resp, err := http.Get(base + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), tc.want) {
			t.Errorf("/readyz with replication not ready (%q): %d %s, want 503 with the message %s", tc.err, resp.StatusCode, body, tc.want)
		}
		cancel()
		<-done
	}
}
