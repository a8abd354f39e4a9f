package pop

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/pop/limit"
	"github.com/edgelimit/edgelimit/pop/rules"
	"github.com/edgelimit/edgelimit/pop/store"
)

// concRules: api_key has 2/min and at most 1 in flight (lease 10 s);
// endpoint has 1 in flight, fail_closed.
func concRules(t testing.TB) *rules.Set {
	root := &rules.Node{}
	k := root.Child("api_key", "")
	k.Add(lim("api", "api_key", 2, rules.Minute))
	k.Add(&rules.Limit{Domain: "api", Path: "api_key", Name: "api_key_concurrency", LeaseTTL: 10 * time.Second,
		Spec: limit.Spec{Limit: 1, Window: int64(10 * time.Second)}})
	root.Child("endpoint", "").Add(&rules.Limit{Domain: "api", Path: "endpoint", Name: "endpoint_concurrency", LeaseTTL: 10 * time.Second,
		FailClosed: true, Spec: limit.Spec{Limit: 1, Window: int64(10 * time.Second)}})
	set, err := rules.NewSet(rules.NewDomain("api", "test", root))
	if err != nil {
		t.Fatal(err)
	}
	return set
}

func concEngine(t testing.TB, l Leaser) (*Engine, *store.Memory) {
	mem := store.NewMemory(store.MemoryConfig{})
	e := NewEngine(mem, concRules(t), nil)
	e.UseLeases(l)
	return e, mem
}

// slotsHeld is how many leases key's set holds at now.
func slotsHeld(l *store.Leases, key []string, now time.Time) int64 {
	lim := &rules.Limit{Domain: "api"}
	r := req(1, key)
	return l.InFlightAt(limit.SlotKeyOf(lim.AppendKey(nil, r.Descriptors[0].Entries)), now.UnixNano())
}

func TestConcurrencyLeases(t *testing.T) {
	leases := store.NewLeases()
	e, _ := concEngine(t, leases)
	ctx := context.Background()
	var res Result
	key := []string{"api_key", "a"}

	if err := e.CheckLeaseAt(ctx, t0, req(1, key), &res); err != nil || res.Code != OK || res.Lease == "" {
		t.Fatalf("first: %v %v lease %q; want admitted with a lease", err, res.Code, res.Lease)
	}
	first := res.Lease
	if n := slotsHeld(leases, key, t0); n != 1 {
		t.Fatalf("%d slots held after one admission", n)
	}
	// The slot is taken: denied by the concurrency limit, with the wait
	// until the lease expires, and the rate limit (1 of 2 left) spends nothing.
	if err := e.CheckLeaseAt(ctx, t0.Add(time.Second), req(1, key), &res); err != nil || res.Code != OverLimit || res.Lease != "" {
		t.Fatalf("second: %v %v lease %q; want denied without a lease", err, res.Code, res.Lease)
	}
	st := res.Statuses[res.Decisive]
	if !st.Limit.Concurrent() || st.RetryAfter != 9*time.Second {
		t.Fatalf("decisive status %+v; want the concurrency limit, retry in 9s", st)
	}
	// Released, the slot is free and the rate limit still has 1 left.
	if state, err := e.Release(ctx, t0.Add(2*time.Second), first, "lease_id"); err != nil || state != limit.Released {
		t.Fatalf("release: %v %v", state, err)
	}
	if state, _ := e.Release(ctx, t0.Add(2*time.Second), first, "lease_id"); state != limit.Unknown {
		t.Fatalf("second release: %v, want unknown", state)
	}
	if err := e.CheckLeaseAt(ctx, t0.Add(3*time.Second), req(1, key), &res); err != nil || res.Code != OK || res.Lease == "" {
		t.Fatalf("third: %v %v; want admitted (the rate limit had room: the denial spent nothing)", err, res.Code)
	}
	if _, err := e.Release(ctx, t0.Add(3*time.Second), res.Lease, "lease_id"); err != nil {
		t.Fatal(err)
	}
	// The rate limit is spent now (2/min): a denial by it holds no slot.
	if err := e.CheckLeaseAt(ctx, t0.Add(4*time.Second), req(1, key), &res); err != nil || res.Code != OverLimit || res.Lease != "" {
		t.Fatalf("fourth: %v %v lease %q; want denied by the rate limit", err, res.Code, res.Lease)
	}
	if st := res.Statuses[res.Decisive]; st.Limit.Concurrent() {
		t.Fatalf("decisive %+v, want the rate limit", st)
	}
	if n := slotsHeld(leases, key, t0.Add(4*time.Second)); n != 0 {
		t.Fatalf("%d slots held after a rate limit denial; a denied request must hold none", n)
	}
}

func TestConcurrencyLeaseExpires(t *testing.T) {
	leases := store.NewLeases()
	e, _ := concEngine(t, leases)
	var res Result
	key := []string{"endpoint", "slow"}
	_ = e.CheckLeaseAt(context.Background(), t0, req(1, key), &res) // never released
	for _, c := range []struct {
		at   time.Duration
		want Code
	}{{9 * time.Second, OverLimit}, {10 * time.Second, OK}} {
		if err := e.CheckLeaseAt(context.Background(), t0.Add(c.at), req(1, key), &res); err != nil || res.Code != c.want {
			t.Fatalf("at +%v: %v %v, want %v", c.at, res.Code, err, c.want)
		}
	}
}

// CheckAt (gRPC, /v1/authz, batches) cannot release, so it takes no slot;
// neither does a check-only descriptor (hits_addend 0).
func TestConcurrencyNotOnCheckAt(t *testing.T) {
	leases := store.NewLeases()
	e, _ := concEngine(t, leases)
	var res Result
	key := []string{"endpoint", "x"}
	for range 3 {
		if err := e.CheckAt(context.Background(), t0, req(1, key), &res); err != nil || res.Code != OK || res.Lease != "" || res.Decisive >= 0 {
			t.Fatalf("CheckAt: %v %v lease %q decisive %d", err, res.Code, res.Lease, res.Decisive)
		}
	}
	zero := int64(0)
	r := req(1, key)
	r.Descriptors[0].HitsAddend = &zero
	if err := e.CheckLeaseAt(context.Background(), t0, r, &res); err != nil || res.Lease != "" {
		t.Fatalf("check only: %v lease %q", err, res.Lease)
	}
	if n := slotsHeld(leases, key, t0); n != 0 {
		t.Fatalf("%d slots held", n)
	}
}

// failingLeaser is a lease store that cannot answer.
type failingLeaser struct{}

var errLeaseDown = errors.New("lease store down")

func (failingLeaser) AcquireAt(context.Context, int64, limit.LeaseID, []limit.SlotItem, []limit.SlotDecision) (bool, error) {
	return false, errLeaseDown
}
func (failingLeaser) ReleaseAt(context.Context, int64, limit.Lease) (limit.ReleaseState, error) {
	return limit.Unknown, errLeaseDown
}

func TestConcurrencyStoreDown(t *testing.T) {
	e, _ := concEngine(t, failingLeaser{})
	var res Result
	// Fails open: the rate limit decides, no lease.
	if err := e.CheckLeaseAt(context.Background(), t0, req(1, []string{"api_key", "a"}), &res); err != nil || res.Code != OK || res.Lease != "" {
		t.Fatalf("fail open: %v %v lease %q", err, res.Code, res.Lease)
	}
	// fail_closed denies.
	if err := e.CheckLeaseAt(context.Background(), t0, req(1, []string{"endpoint", "a"}), &res); err != nil || res.Code != OverLimit {
		t.Fatalf("fail closed: %v %v", err, res.Code)
	}
	lease := limit.Lease{Keys: []limit.SlotKey{{1}}}
	if _, err := e.Release(context.Background(), t0, lease.String(), "lease_id"); !errors.Is(err, errLeaseDown) {
		t.Fatalf("release on a failed store: %v, want its error", err)
	}
	var re *RequestError
	if _, err := e.Release(context.Background(), t0, "not-a-lease", "lease_ids[3]"); !errors.As(err, &re) || re.Field != "lease_ids[3]" {
		t.Fatalf("malformed: %v, want a RequestError naming lease_ids[3]", err)
	}
}

func TestConcurrencyHeaders(t *testing.T) {
	e, _ := concEngine(t, store.NewLeases())
	var res Result
	_ = e.CheckLeaseAt(context.Background(), t0, req(1, []string{"api_key", "h"}), &res)
	vals := HeaderValues(t0, &res)
	if want := `"api_key";q=2;w=60, "api_key_concurrency";q=1;qu="concurrent-requests"`; vals[3] != want {
		t.Errorf("RateLimit-Policy %q, want %q", vals[3], want)
	}
	if want := `"api_key_concurrency";r=0`; vals[4] != want {
		t.Errorf("RateLimit %q, want %q (no t while admitted)", vals[4], want)
	}
	_ = e.CheckLeaseAt(context.Background(), t0.Add(time.Second), req(1, []string{"api_key", "h"}), &res)
	vals = HeaderValues(t0.Add(time.Second), &res)
	if want := `"api_key_concurrency";r=0;t=9`; vals[4] != want || vals[5] != "9" {
		t.Errorf("denied: RateLimit %q Retry-After %q, want %q and 9", vals[4], vals[5], want)
	}
}

// BenchmarkEngineConcurrency is the engine alone, over 4096 keys: "rate" is
// CheckAt of a rate limit; "rate+concurrency" is CheckLeaseAt of the same
// rate limit plus a concurrency limit and the Release of its lease.
func BenchmarkEngineConcurrency(b *testing.B) {
	for _, conc := range []bool{false, true} {
		root := &rules.Node{}
		n := root.Child("api_key", "")
		n.Add(lim("api", "api_key", 1<<40, rules.Second))
		if conc {
			n.Add(&rules.Limit{Domain: "api", Path: "api_key", Name: "in_flight", LeaseTTL: time.Minute,
				Spec: limit.Spec{Limit: 1 << 30, Window: int64(time.Minute)}})
		}
		set, _ := rules.NewSet(rules.NewDomain("api", "bench", root))
		e := NewEngine(store.NewMemory(store.MemoryConfig{}), set, nil)
		e.UseLeases(store.NewLeases())
		reqs := make([]*Request, 4096)
		for i := range reqs {
			reqs[i] = req(1, []string{"api_key", strconv.Itoa(i)})
		}
		name := "rate"
		if conc {
			name = "rate+concurrency"
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				var res Result
				i := 0
				for pb.Next() {
					now := t0.Add(time.Duration(i))
					if err := e.CheckLeaseAt(context.Background(), now, reqs[i%len(reqs)], &res); err != nil || res.Code != OK {
						b.Fatal(err, res.Code)
					}
					if conc {
						if _, err := e.Release(context.Background(), now, res.Lease, "lease_id"); err != nil {
							b.Fatal(err)
						}
					}
					i++
				}
			})
		})
	}
}
