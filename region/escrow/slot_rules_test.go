package escrow_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgelimit/edgelimit/crdt"
	"github.com/edgelimit/edgelimit/pop/rules"
	"github.com/edgelimit/edgelimit/region/escrow"
)

// The escrow mark (0x00 0xE5 at the start of a slot's Key) must never begin
// an ordinary limit key, or a count would be routed to the Ledger (and an
// escrow item summed as a count). Store keys are built by
// rules.Limit.AppendKey, which begins with the uvarint length of the domain
// name; the rule loader refuses an empty domain, and the uvarint of a length
// of 1 or more never begins with a zero byte. These tests pin both halves
// from this side, so that relaxing either fails here.

func TestLoaderRefusesEmptyDomain(t *testing.T) {
	path := filepath.Join(t.TempDir(), "empty.yaml")
	if err := os.WriteFile(path, []byte("domain: ''\ndescriptors: []\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := rules.Load(path); err == nil {
		t.Fatal("rules.Load accepted an empty domain: a limit key could begin with the escrow mark")
	}
}

func TestLimitKeysAreNotSlots(t *testing.T) {
	const file = `domain: d
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 1, scope: global}
  - key: m
    rate_limit: {unit: minute, unit_multiplier: 5, requests_per_unit: 1, scope: region}
`
	path := filepath.Join(t.TempDir(), "d.yaml")
	if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	set, _, err := rules.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range [][]rules.Entry{{{Key: "k", Value: "\x00\xe5"}}, {{Key: "m", Value: ""}}} {
		for _, l := range set.Domain("d").Match(e) {
			key := string(l.AppendKey(nil, e))
			if escrow.IsSlot(crdt.Slot{Key: key, Replica: "a", Count: 1}) {
				t.Fatalf("limit key %q is taken for an escrow slot", key)
			}
			n++
		}
	}
	if n != 2 {
		t.Fatalf("matched %d limits, want 2", n)
	}
}

// FuzzLimitKeyNotSlot: whatever the (non-empty) domain, entries and
// multiplier, AppendKey never writes the escrow mark first.
func FuzzLimitKeyNotSlot(f *testing.F) {
	f.Add("d", "k", "v", uint32(0))
	f.Add("\x00\xe5", "\x00", "\x00\xe5", uint32(5))
	f.Add(strings.Repeat("x", 229), "", "", uint32(1))
	f.Fuzz(func(t *testing.T, domain, key, value string, mult uint32) {
		if domain == "" { // the loader refuses it (TestLoaderRefusesEmptyDomain)
			return
		}
		l := &rules.Limit{Domain: domain, Multiplier: mult}
		k := string(l.AppendKey(nil, []rules.Entry{{Key: key, Value: value}}))
		if escrow.IsSlot(crdt.Slot{Key: k, Replica: "a"}) {
			t.Fatalf("limit key %q of domain %q is taken for an escrow slot", k, domain)
		}
		if _, err := escrow.DecodeSlot(crdt.Slot{Key: k, Replica: "a"}); err == nil {
			t.Fatalf("DecodeSlot accepted limit key %q", k)
		}
	})
}
