package pop

import (
	"context"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/pop/limit"
	"github.com/edgelimit/edgelimit/pop/rules"
	"github.com/edgelimit/edgelimit/pop/store"
)

// mitigatedPoP is a PoP with a replicating store and a mitigation table,
// holding a global limit of n per minute on "ip" (and a pop-scoped one on
// "local").
func mitigatedPoP(t testing.TB, name string, n int64, ban time.Duration) (*Engine, *Mitigations, *store.Memory) {
	root := &rules.Node{}
	g := lim("api", "ip", n, rules.Minute)
	g.Scope, g.Mitigation = rules.ScopeGlobal, ban
	root.Child("ip", "").Add(g)
	root.Child("local", "").Add(lim("api", "local", n, rules.Minute))
	set, err := rules.NewSet(rules.NewDomain("api", "test", root))
	if err != nil {
		t.Fatal(err)
	}
	mem := store.NewMemory(store.MemoryConfig{Replica: name})
	m := NewMitigations(name)
	e := NewEngine(mem, set, nil)
	e.UseMitigations(m)
	return e, m, mem
}

func TestMitigationBits(t *testing.T) {
	a, ma, _ := mitigatedPoP(t, "a", 5, 0)
	b, mb, memB := mitigatedPoP(t, "b", 5, 0)
	ctx := context.Background()
	var res Result
	at := t0.Add(30 * time.Second)
	ip := []string{"ip", "1.2.3.4"}
	for range 5 {
		if err := a.CheckAt(ctx, at, req(1, ip), &res); err != nil || res.Code != OK {
			t.Fatalf("a: %v %+v", err, res)
		}
	}
	if err := a.CheckAt(ctx, at, req(1, ip), &res); err != nil || res.Code != OverLimit {
		t.Fatalf("6th at a: %v %+v", err, res)
	}
	bits := ma.BitsDelta()
	if len(bits) != 1 || bits[0].Origin != "a" || bits[0].Scope != uint8(limit.ScopeGlobal) {
		t.Fatalf("a issued %v, want one global bit", bits)
	}
	// No more hits: the estimate 5 falls under 5 in the next window once
	// 5 × (60 − e)/60 ≤ 4, at e = 12 s: 30 s + 12 s from now.
	if want := at.Add(42 * time.Second).UnixNano(); bits[0].Until != want {
		t.Fatalf("bit until %v, want %v", time.Unix(0, bits[0].Until), time.Unix(0, want))
	}

	// b has counted nothing and not heard from a's store, but takes the bit:
	// it denies at once, without its store.
	mb.ApplyBits(bits)
	memB.Delta() // clear
	if err := b.CheckAt(ctx, at.Add(time.Second), req(1, ip), &res); err != nil || res.Code != OverLimit {
		t.Fatalf("b with the bit: %v %+v", err, res)
	}
	if got := res.Statuses[0].RetryAfter; got != 41*time.Second {
		t.Fatalf("b's Retry-After %v, want the bit's 41s", got)
	}
	if d := memB.Delta(); len(d) != 0 {
		t.Fatalf("a mitigated check reached b's store: %v", d)
	}
	// Pop-scoped limits ignore bits.
	if err := b.CheckAt(ctx, at, req(1, []string{"local", "1.2.3.4"}), &res); err != nil || res.Code != OK {
		t.Fatalf("pop-scoped: %v %+v", err, res)
	}
	// The bit ends on time: b's own counts are empty, so it admits.
	if err := b.CheckAt(ctx, at.Add(42*time.Second), req(1, ip), &res); err != nil || res.Code != OK {
		t.Fatalf("after the bit ended: %v %+v", err, res)
	}
	if got := len(mb.Active(at.Add(42 * time.Second).UnixNano())); got != 0 {
		t.Fatalf("%d bits active after the end", got)
	}
}

func TestMitigationBan(t *testing.T) {
	a, ma, _ := mitigatedPoP(t, "a", 2, 10*time.Minute)
	ctx := context.Background()
	var res Result
	ip := []string{"ip", "5.6.7.8"}
	for range 3 {
		a.CheckAt(ctx, t0, req(1, ip), &res)
	}
	bits := ma.BitsDelta()
	if len(bits) != 1 || bits[0].Until != t0.Add(10*time.Minute).UnixNano() {
		t.Fatalf("bits %v, want a 10m ban", bits)
	}
	// Two windows later the counts are gone, but the ban holds.
	if a.CheckAt(ctx, t0.Add(3*time.Minute), req(1, ip), &res); res.Code != OverLimit {
		t.Fatal("the ban did not hold")
	}
}

func TestMitigationNotForManyHits(t *testing.T) {
	a, ma, _ := mitigatedPoP(t, "a", 5, 0)
	var res Result
	a.CheckAt(context.Background(), t0, req(4, []string{"ip", "9.9.9.9"}), &res)
	a.CheckAt(context.Background(), t0, req(4, []string{"ip", "9.9.9.9"}), &res)
	if res.Code != OverLimit {
		t.Fatal("4 + 4 hits of 5 admitted")
	}
	if bits := ma.BitsDelta(); len(bits) != 0 {
		t.Fatalf("a 4-hit denial with room for 1 issued %v", bits)
	}
}

// BenchmarkMitigatedVsUnmitigated compares a check of a key held by a
// mitigation bit with a check of an unmitigated key, on one PoP with a
// replicating store: the first never reaches the store.
func BenchmarkMitigatedVsUnmitigated(b *testing.B) {
	e, m, _ := mitigatedPoP(b, "a", 1<<40, 0)
	ctx := context.Background()
	mitigated := req(1, []string{"ip", "bad"})
	var res Result
	_ = e.CheckAt(ctx, t0, mitigated, &res)
	k := &scratch{}
	k.keys = e.rules.Load().Domain("api").Match(mitigated.Descriptors[0].Entries)[0].AppendKey(nil, mitigated.Descriptors[0].Entries)
	m.Issue(k.keys, limit.ScopeGlobal, t0.Add(time.Hour).UnixNano(), t0.UnixNano())
	for _, c := range []struct {
		name string
		r    *Request
	}{{"unmitigated", req(1, []string{"ip", "good"})}, {"mitigated", mitigated}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				var res Result
				for pb.Next() {
					_ = e.CheckAt(ctx, t0, c.r, &res)
				}
			})
		})
	}
}

// A key found over its limit again and again is not re-issued for every
// small extension of its end.
func TestMitigationExtension(t *testing.T) {
	m := NewMitigations("a")
	key := []byte("k")
	now := t0.UnixNano()
	sec := int64(time.Second)
	if !m.Issue(key, limit.ScopeGlobal, now+40*sec, now) {
		t.Fatal("a new bit was not issued")
	}
	if m.Issue(key, limit.ScopeGlobal, now+42*sec, now) {
		t.Fatal("a 2 s extension of a 40 s bit was re-issued")
	}
	if !m.Issue(key, limit.ScopeGlobal, now+50*sec, now) {
		t.Fatal("a 10 s extension of a 40 s bit was not issued")
	}
	if m.Issue(key, limit.ScopeGlobal, now+30*sec, now) {
		t.Fatal("an earlier end shortened the bit")
	}
	if got := len(m.BitsDelta()); got != 2 {
		t.Fatalf("%d bits to publish, want 2", got)
	}
	if m.Issue([]byte("short"), limit.ScopeGlobal, now+int64(time.Millisecond), now) {
		t.Fatal("a 1 ms bit was issued: it ends before it can reach anyone")
	}
}

// While the region is cut off, a global limit is enforced at its share; pop
// limits are untouched; 1 restores the full limit.
func TestGlobalShare(t *testing.T) {
	e, _, _ := mitigatedPoP(t, "a", 10, 0)
	ctx := context.Background()
	var res Result
	e.SetGlobalShare(0.5)
	admitted := 0
	for range 10 {
		if e.CheckAt(ctx, t0, req(1, []string{"ip", "x"}), &res); res.Code == OK {
			admitted++
		}
	}
	if admitted != 5 || res.Statuses[0].Limit.Spec.Limit != 10 {
		t.Fatalf("admitted %d at share 0.5 of 10", admitted)
	}
	local := 0
	for range 10 {
		if e.CheckAt(ctx, t0, req(1, []string{"local", "x"}), &res); res.Code == OK {
			local++
		}
	}
	if local != 10 {
		t.Fatalf("a pop-scoped limit admitted %d of 10 at share 0.5", local)
	}
	e.SetGlobalShare(1)
	if e.CheckAt(ctx, t0, req(1, []string{"ip", "x"}), &res); res.Code != OK || e.GlobalShare() != 1 {
		t.Fatal("share 1 did not restore the full limit")
	}
}

// TestBitsIssued: an issued bit leaves one token for replication to publish
// it at once; further issues before the token is taken add none and never
// block; an issue that changes nothing (too short, or a small extension)
// leaves no token.
func TestBitsIssued(t *testing.T) {
	m := NewMitigations("p1")
	c := m.BitsIssued()
	now := int64(1e18)
	tokens := func() int {
		n := 0
		for {
			select {
			case <-c:
				n++
			default:
				return n
			}
		}
	}
	if !m.Issue([]byte("a"), limit.ScopeGlobal, now+int64(time.Minute), now) || !m.Issue([]byte("b"), limit.ScopeGlobal, now+int64(time.Minute), now) {
		t.Fatal("fresh bits not issued")
	}
	if n := tokens(); n != 1 {
		t.Fatalf("%d tokens after two issues, want 1", n)
	}
	if got := len(m.BitsDelta()); got != 2 {
		t.Fatalf("BitsDelta returned %d bits, want 2", got)
	}
	if m.Issue([]byte("c"), limit.ScopeGlobal, now+int64(time.Millisecond), now) ||
		m.Issue([]byte("a"), limit.ScopeGlobal, now+int64(time.Minute)+1, now) {
		t.Fatal("a too-short bit or a tiny extension was issued")
	}
	if n := tokens(); n != 0 {
		t.Fatalf("%d tokens after issues that changed nothing, want 0", n)
	}
}

// Only an eventual limit issues bits: a strong limit's denial may be made
// without its home (fail_closed, or the share while the home is away) and
// says nothing of the key elsewhere, as a bounded one's says only that this
// PoP's allowance is spent.
func TestBitsOnlyForEventual(t *testing.T) {
	for _, c := range []limit.Consistency{limit.Eventual, limit.Bounded, limit.Strong} {
		root := &rules.Node{}
		g := lim("api", "ip", 5, rules.Minute)
		g.Scope, g.Consistency = rules.ScopeGlobal, c
		root.Child("ip", "").Add(g)
		set, err := rules.NewSet(rules.NewDomain("api", "test", root))
		if err != nil {
			t.Fatal(err)
		}
		m := NewMitigations("a")
		e := NewEngine(store.NewMemory(store.MemoryConfig{Replica: "a"}), set, nil)
		e.UseMitigations(m)
		var res Result
		at := t0.Add(30 * time.Second)
		for range 6 {
			if err := e.CheckAt(context.Background(), at, req(1, []string{"ip", "1.2.3.4"}), &res); err != nil {
				t.Fatal(err)
			}
		}
		if res.Code != OverLimit {
			t.Fatalf("%v: the 6th of a limit of 5: %+v", c, res)
		}
		want := 0
		if c == limit.Eventual {
			want = 1
		}
		if bits := m.BitsDelta(); len(bits) != want {
			t.Errorf("%v: %d bits issued for a denial, want %d", c, len(bits), want)
		}
	}
}
