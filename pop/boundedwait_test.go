package pop

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/crdt"
	"github.com/edgelimit/edgelimit/pop/rules"
	"github.com/edgelimit/edgelimit/pop/store"
	"github.com/prometheus/client_golang/prometheus"
)

// boundedPair returns two replicating stores of one region, each with its
// engine over a global limit of 10 per hour with consistency bounded; the
// first engine waits for allowance (UseAllowanceWait) and reports to reg.
func boundedPair(t *testing.T, reg prometheus.Registerer) (engines [2]*Engine, stores [2]*store.Memory) {
	t.Helper()
	return boundedPairWith(t, reg, "")
}

// boundedPairWith is boundedPair with more rules: extra is appended to the
// rule file's descriptors.
func boundedPairWith(t *testing.T, reg prometheus.Registerer, extra string) (engines [2]*Engine, stores [2]*store.Memory) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "r.yaml")
	file := "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 10, scope: global, consistency: bounded}\n" + extra
	if err := os.WriteFile(p, []byte(file), 0o644); err != nil {
		t.Fatal(err)
	}
	set, _, err := rules.Load(p)
	if err != nil {
		t.Fatal(err)
	}
	names := []string{"a", "b"}
	for i := range stores {
		stores[i] = store.NewMemory(store.MemoryConfig{Replica: names[i], RegionPeers: names, Replicas: names})
		engines[i] = NewEngine(stores[i], set, nil)
	}
	engines[0] = NewEngine(stores[0], set, NewMetrics(reg))
	engines[0].UseAllowanceWait(stores[0], time.Minute)
	return engines, stores
}

// exchange delivers what take says of each store at now to the other.
func exchange(now int64, take func(*store.Memory, int64) []crdt.Slot, st [2]*store.Memory) {
	a, b := take(st[0], now), take(st[1], now)
	st[1].ApplyAt(now, now, a)
	st[0].ApplyAt(now, now, b)
}

// outcome returns, of the series of metric name in reg whose outcome label
// is value, its value as a counter and its count of samples as a histogram
// (0 when there is no such series yet).
func outcome(t *testing.T, reg *prometheus.Registry, name, value string) (counter float64, samples uint64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" && l.GetValue() == value {
					return m.GetCounter().GetValue(), m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return 0, 0
}

// denied is edgelimit_decisions_total{outcome="denied"} in reg.
func denied(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	n, _ := outcome(t, reg, "edgelimit_decisions_total", "denied")
	return n
}

// waits is how many waits for bounded allowance ended with result in reg.
func waits(t *testing.T, reg *prometheus.Registry, result string) int {
	t.Helper()
	_, n := outcome(t, reg, "edgelimit_bounded_wait_seconds", result)
	return int(n)
}

// A check that a bounded limit denies while another PoP holds allowance it
// does not need waits for that PoP's give and is admitted when it arrives;
// a check over the limit itself is denied without waiting.
func TestBoundedCheckWaitsForAllowance(t *testing.T) {
	reg := prometheus.NewRegistry()
	eng, st := boundedPair(t, reg)
	now := t0.Add(10 * time.Second)
	exchange(now.UnixNano(), (*store.Memory).OwnAt, st) // each has heard the other
	// From here on, nothing is exchanged until the test says so.
	r := req(1, []string{"k", "client"})
	r.Domain = "d"
	var res Result
	for i := range 5 { // a's half of the limit
		if err := eng[0].CheckAt(context.Background(), now, r, &res); err != nil || res.Code != OK {
			t.Fatalf("check %d at a: %v, %v; want OK within a's half", i+1, res.Code, err)
		}
	}

	// The sixth waits: b holds five it does not need, and gives them once it
	// hears a's demand.
	done := make(chan Code, 1)
	go func() {
		var res Result
		if err := eng[0].CheckAt(context.Background(), now, r, &res); err != nil {
			t.Error(err)
		}
		done <- res.Code
	}()
	// Only once it waits does the exchange begin: b, which has no demand of
	// its own, would otherwise give a its half before the check is made.
	for gauge(t, reg, "edgelimit_bounded_waiting_checks") != 1 {
		select {
		case c := <-done:
			t.Fatalf("the sixth check was decided (%v) without waiting", c)
		case <-time.After(time.Millisecond):
		}
	}
	var got Code
	for round := 1; ; round++ {
		at := now.Add(time.Duration(round) * 10 * time.Millisecond).UnixNano()
		exchange(at, (*store.Memory).DeltaAt, st) // a's demand out, b's gives back
		select {
		case got = <-done:
		case <-time.After(10 * time.Millisecond):
			if round > 3000 {
				t.Fatal("the waiting check was not decided within 30 s of exchanges")
			}
			continue
		}
		break
	}
	if got != OK {
		t.Fatalf("the check that waited for b's give got %v, want OK", got)
	}
	if n := waits(t, reg, "admitted"); n != 1 {
		t.Fatalf("edgelimit_bounded_wait_seconds{outcome=admitted} counted %d waits, want 1", n)
	}

	// b gave a all it held (it had no demand): a spends the rest of the
	// limit, and then denies at once, since nothing is on its way.
	later := now.Add(time.Minute)
	exchange(later.UnixNano(), (*store.Memory).OwnAt, st)
	admitted := 6
	for {
		start := time.Now()
		if err := eng[0].CheckAt(context.Background(), later, r, &res); err != nil {
			t.Fatal(err)
		}
		if res.Code != OK {
			if n := waits(t, reg, "admitted") + waits(t, reg, "denied"); n != 1 {
				t.Fatalf("a check over the limit everywhere waited (%d waits recorded, took %v)", n-1, time.Since(start))
			}
			break
		}
		if admitted++; admitted > 10 {
			t.Fatalf("a admitted %d of a limit of 10", admitted)
		}
	}
	if admitted != 10 {
		t.Fatalf("a admitted %d before denying, want the whole limit of 10", admitted)
	}
	// Only the final decision of the check that waited is in the
	// decisions: 6 allowed and 1 denied at a.
	if d := denied(t, reg); d != 1 {
		t.Fatalf("a's denied decisions %v, want 1 (the wait's first denial is not a decision)", d)
	}
}

// A check whose caller gives up soon does not wait past what lets its
// answer arrive: behind Envoy's filter (20 ms by default, failing open), a
// denial that came after the caller gave up would let the request through
// uncounted.
func TestBoundedWaitWithinTheCallersDeadline(t *testing.T) {
	reg := prometheus.NewRegistry()
	eng, st := boundedPair(t, reg)
	now := t0.Add(10 * time.Second)
	exchange(now.UnixNano(), (*store.Memory).OwnAt, st)
	r := req(1, []string{"k", "client"})
	r.Domain = "d"
	var res Result
	for range 5 {
		if err := eng[0].CheckAt(context.Background(), now, r, &res); err != nil || res.Code != OK {
			t.Fatalf("a's half: %v, %v", res.Code, err)
		}
	}
	// b holds five it does not need, but no give ever comes (nothing is
	// exchanged): a check with 1 ms left does not wait at all.
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	if err := eng[0].CheckAt(ctx, now, r, &res); err != nil || res.Code != OverLimit {
		t.Fatalf("with 1 ms left: %v, %v; want OVER_LIMIT at once", res.Code, err)
	}
	if n := waits(t, reg, "admitted") + waits(t, reg, "denied"); n != 0 {
		t.Fatalf("a check with 1 ms left waited (%d waits recorded)", n)
	}
	// With 2 s left it waits, and answers before the deadline.
	ctx, cancel = context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := eng[0].CheckAt(ctx, now, r, &res); err != nil || res.Code != OverLimit {
		t.Fatalf("with 2 s left and no give: %v, %v; want OVER_LIMIT", res.Code, err)
	}
	if ctx.Err() != nil {
		t.Fatal("the check answered after its caller's deadline")
	}
	if n := waits(t, reg, "denied"); n != 1 {
		t.Fatalf("%d waits ended denied, want the one that waited for b's give", n)
	}
}

// A request whose denial spent something does not wait: deciding it again
// would spend it twice. Here a pop-scope limit counts denied hits (Envoy's
// way, SetCountDenied), so a check that the bounded limit denies has
// counted a hit there already.
func TestBoundedWaitNotWhenTheDenialSpent(t *testing.T) {
	reg := prometheus.NewRegistry()
	eng, st := boundedPairWith(t, reg, "  - key: p\n    rate_limit: {unit: hour, requests_per_unit: 100}\n")
	eng[0].SetCountDenied(true)
	now := t0.Add(10 * time.Second)
	exchange(now.UnixNano(), (*store.Memory).OwnAt, st)
	r := req(1, []string{"k", "client"}, []string{"p", "client"})
	r.Domain = "d"
	var res Result
	for range 5 {
		if err := eng[0].CheckAt(context.Background(), now, r, &res); err != nil || res.Code != OK {
			t.Fatalf("a's half: %v, %v", res.Code, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := eng[0].CheckAt(ctx, now, r, &res); err != nil || res.Code != OverLimit {
		t.Fatalf("the sixth: %v, %v; want OVER_LIMIT", res.Code, err)
	}
	if n := waits(t, reg, "admitted") + waits(t, reg, "denied"); n != 0 {
		t.Fatalf("a request whose denial counted a hit at the pop-scope limit waited (%d waits)", n)
	}
}
