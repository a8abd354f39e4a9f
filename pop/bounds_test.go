package pop

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/pop/rules"
	"github.com/edgelimit/edgelimit/pop/store"
)

// TestReplicaBounds: the bounds follow the rules, and what an honest engine
// admits — one hit, or many at once, up to and past the limit — never
// exceeds them.
func TestReplicaBounds(t *testing.T) {
	const n = 5
	ban := 10 * time.Minute
	e, m, mem := mitigatedPoP(t, "a", n, ban)
	b := e.ReplicaBounds()
	ctx := context.Background()
	var res Result
	at := t0.Add(30 * time.Second)
	ip := []string{"ip", "1.2.3.4"}
	for _, hits := range []int64{1, 3, 1, 1, 2, 1} { // 5 admitted, then denials
		if err := e.CheckAt(ctx, at, req(hits, ip), &res); err != nil {
			t.Fatal(err)
		}
	}
	own := mem.Own()
	if len(own) != 1 {
		t.Fatalf("own slots %v, want the global key's", own)
	}
	key := own[0].Key
	if got, want := b.CountFloor(), uint64(BoundFactor*n); got != want {
		t.Errorf("CountFloor = %d, want %d (the lowest replicable limit's bound)", got, want)
	}
	if got, want := b.MaxCount(key), uint64(BoundFactor*n); got != want {
		t.Errorf("MaxCount(global key) = %d, want %d", got, want)
	}
	if own[0].Count > b.MaxCount(key) {
		t.Errorf("an honest count %d is above the bound %d", own[0].Count, b.MaxCount(key))
	}
	bits := m.BitsDelta()
	if len(bits) != 1 {
		t.Fatalf("bits %v, want one", bits)
	}
	if got, want := b.MaxBit(key), ban+bitSlack; got != want {
		t.Errorf("MaxBit(banned key) = %v, want %v", got, want)
	}
	if d := time.Duration(bits[0].Until - at.UnixNano()); d > b.MaxBit(key) {
		t.Errorf("an honest bit runs %v, above the bound %v", d, b.MaxBit(key))
	}

	// Without a ban, a bit holds at most two windows.
	e2, _, _ := mitigatedPoP(t, "b", n, 0)
	if got, want := e2.ReplicaBounds().MaxBit(key), 2*time.Minute+bitSlack; got != want {
		t.Errorf("MaxBit(unbanned key) = %v, want %v", got, want)
	}

	local := e.Rules().Domain("api").Match([]rules.Entry{{Key: "local", Value: "x"}})[0]
	other := *e.Rules().Domain("api").Match([]rules.Entry{{Key: "ip", Value: "x"}})[0]
	other.Domain = "elsewhere"
	for _, c := range []struct {
		name string
		key  string
		want uint64
	}{
		{"pop scope never replicates", string(local.AppendKey(nil, []rules.Entry{{Key: "local", Value: "x"}})), 0},
		{"not a store key", "garbage", 0},
		{"a domain this PoP does not know", string(other.AppendKey(nil, []rules.Entry{{Key: "ip", Value: "x"}})), BoundFactor * MaxHits},
	} {
		if got := b.MaxCount(c.key); got != c.want {
			t.Errorf("%s: MaxCount = %d, want %d", c.name, got, c.want)
		}
	}
}

func BenchmarkReplicaBoundsMaxCount(b *testing.B) {
	e, _, mem := mitigatedPoP(b, "a", 5, 0)
	var res Result
	_ = e.CheckAt(context.Background(), t0, req(1, []string{"ip", "1.2.3.4"}), &res)
	key := mem.Own()[0].Key
	bounds := e.ReplicaBounds()
	b.ReportAllocs()
	for b.Loop() {
		if bounds.MaxCount(key) == 0 {
			b.Fatal("no bound")
		}
	}
}

// TestReplicaBoundsTenants: in a domain with tenants a key's limit is its
// tier's or a per-key override from the quota store, which the rules alone
// do not tell: counts there are not bounded (a per-key override of 10,000 on
// a rule of 100 is honest), and a bit may hold as long as the domain's
// longest ban.
func TestReplicaBoundsTenants(t *testing.T) {
	p := filepath.Join(t.TempDir(), "r.yaml")
	file := strings.ReplaceAll(tenantRuleFile, "requests_per_unit: 100}", "requests_per_unit: 100, scope: global}")
	if err := os.WriteFile(p, []byte(file), 0o644); err != nil {
		t.Fatal(err)
	}
	set, _, err := rules.Load(p)
	if err != nil {
		t.Fatal(err)
	}
	e := NewEngine(store.NewMemory(store.MemoryConfig{}), set, nil)
	l := e.Rules().Domain("api").Match([]rules.Entry{{Key: "api_key", Value: "k"}})[0]
	key := string(l.AppendKey(nil, []rules.Entry{{Key: "api_key", Value: "k"}}))
	if _, ok := rules.ParseKey(key, nil); !ok {
		t.Fatalf("key %q does not parse", key)
	}
	b := e.ReplicaBounds()
	if got := b.MaxCount(key); got != math.MaxUint64 {
		t.Errorf("MaxCount in a tenant domain = %d, want no bound", got)
	}
	if got, want := b.MaxBit(key), 2*time.Minute+bitSlack; got != want {
		t.Errorf("MaxBit in a tenant domain = %v, want %v", got, want)
	}
}
