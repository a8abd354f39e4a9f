package deploy

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The nkey files the PoPs of compose.yaml mount are readable by the user the
// image runs as: edgelimit natsconf writes them 0600 for whoever ran it, so
// compose.yaml's setup steps give them to the Dockerfile's USER (chown, the
// mode kept). Before, the steps left them root's, and every PoP failed to
// read its key at start.
func TestComposeKeysReadableByImageUser(t *testing.T) {
	m := regexp.MustCompile(`(?m)^USER (\d+)(?::\d+)?$`).FindStringSubmatch(readRepoFile(t, "deploy/Dockerfile"))
	if m == nil {
		t.Fatal("the Dockerfile sets no numeric USER")
	}
	uid := m[1]
	keys := natsKeys(t, composeTopology(t))
	nks, _ := filepath.Glob(filepath.Join(keys, "*.nk"))
	if len(nks) == 0 {
		t.Fatal("edgelimit natsconf wrote no .nk file")
	}
	for _, f := range nks {
		fi, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm()&0o004 != 0 {
			t.Errorf("%s is readable by anyone (%v): a seed must not be", filepath.Base(f), fi.Mode().Perm())
		}
	}
	compose := readRepoFile(t, "deploy/compose.yaml")
	natsconf := strings.Index(compose, "edgelimit natsconf")
	up := strings.Index(compose, "docker compose up")
	chown := regexp.MustCompile(`#\s+(?:sudo )?chown ` + uid + `(?::\d+)? nats/keys/\*\.nk`).FindStringIndex(compose)
	if chown == nil || natsconf < 0 || up < 0 || chown[0] < natsconf || chown[0] > up {
		t.Fatalf("compose.yaml's setup steps do not give the keys to uid %s (the Dockerfile's USER) between edgelimit natsconf and docker compose up: "+
			"the PoPs, running as %s, cannot read files natsconf writes 0600", uid, uid)
	}
}
