package deploy

import (
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestREADMEFlagTable: every flag of `edgelimit pop --help` has a row in
// README.md's flag table (its first cell names it), and every flag the
// table names exists: the binary's flag set is the one source of truth.
func TestREADMEFlagTable(t *testing.T) {
	flags := popFlags(t)
	var table []string
	for _, line := range strings.Split(readRepoFile(t, "README.md"), "\n") {
		if !strings.HasPrefix(line, "| `--") {
			continue
		}
		first := strings.SplitN(line, "|", 3)[1]
		for _, m := range regexp.MustCompile("`--([a-z0-9-]+)`").FindAllStringSubmatch(first, -1) {
			table = append(table, m[1])
		}
	}
	for _, f := range flags {
		if !slices.Contains(table, f) {
			t.Errorf("--%s is in 'edgelimit pop --help' but not in README.md's flag table", f)
		}
	}
	for _, f := range table {
		if !slices.Contains(flags, f) {
			t.Errorf("README.md's flag table names --%s, which 'edgelimit pop --help' does not list", f)
		}
	}
}
