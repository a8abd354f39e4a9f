package quota_test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"reflect"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/pop/limit"
	"github.com/edgelimit/edgelimit/pop/quota"
	"github.com/edgelimit/edgelimit/pop/rules"
)

// An index answers what it was given, through replaces, changes, deletes and
// the fold of a large delta into the base, and honours effective_at and
// expires_at.
func TestIndex(t *testing.T) {
	var x quota.Index
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if x.QuotaAt(now.UnixNano(), "a") != nil || x.Len() != 0 {
		t.Fatal("the zero index is not empty")
	}
	x.Replace([]*quota.Quota{mkQuota("a", "pro"), mkQuota("b", "free")}, 7)
	if q := x.QuotaAt(now.UnixNano(), "a"); q == nil || q.Tier != "pro" || x.Version() != 7 || x.Len() != 2 {
		t.Fatalf("after Replace: %v, version %d, len %d", q, x.Version(), x.Len())
	}
	later := mkQuota("c", "pro")
	later.EffectiveAt, later.ExpiresAt = quota.TimeOf(now.Add(time.Hour)), quota.TimeOf(now.Add(2*time.Hour))
	x.Apply([]quota.Change{{APIKey: "a"}, {APIKey: "c", Quota: later}, {APIKey: "b", Quota: mkQuota("b", "enterprise")}}, 9)
	if x.QuotaAt(now.UnixNano(), "a") != nil || x.Get("b").Tier != "enterprise" || x.Len() != 2 || x.Version() != 9 {
		t.Fatalf("after Apply: a %v, b %v, len %d", x.Get("a"), x.Get("b"), x.Len())
	}
	for _, c := range []struct {
		at   time.Duration
		want bool
	}{{0, false}, {time.Hour, true}, {90 * time.Minute, true}, {2 * time.Hour, false}} {
		if got := x.QuotaAt(now.Add(c.at).UnixNano(), "c") != nil; got != c.want {
			t.Errorf("c at +%v in force %v, want %v", c.at, got, c.want)
		}
	}
	// Enough changes to fold the delta into a new base.
	var cs []quota.Change
	for i := range 3000 {
		cs = append(cs, quota.Change{APIKey: fmt.Sprint("k", i), Quota: mkQuota(fmt.Sprint("k", i), "pro")})
	}
	x.Apply(cs, 10)
	x.Apply([]quota.Change{{APIKey: "k5"}}, 11)
	if x.Len() != 2+3000-1 || x.Get("k5") != nil || x.Get("k6") == nil || x.Get("b").Tier != "enterprise" || len(x.All()) != x.Len() {
		t.Fatalf("after the fold: len %d, all %d", x.Len(), len(x.All()))
	}
}

// An override replaces the quota of the limit it names, keeps its
// algorithm, scope and name, and a plan's Limit does not allocate once it
// has seen the limit.
func TestQuotaLimit(t *testing.T) {
	l := &rules.Limit{Name: "tier:pro", Unit: rules.Minute, Scope: rules.ScopeGlobal, Spec: limit.Spec{Algorithm: limit.SlidingWindow, Limit: 100, Window: int64(time.Minute)}}
	other := &rules.Limit{Name: "other", Unit: rules.Minute, Spec: l.Spec}
	q := mkQuota("k", "pro", quota.Override{Descriptor: "tier:pro", RequestsPerUnit: 7, Unit: rules.Hour}).Plan()
	got := q.Limit(l)
	if got == l || got.Spec.Limit != 7 || got.Unit != rules.Hour || got.Spec.Window != int64(time.Hour) || got.Scope != rules.ScopeGlobal || got.Name != "tier:pro" {
		t.Fatalf("overridden limit: %+v", got)
	}
	if q.Limit(other) != other || (*quota.Plan)(nil).Limit(l) != l {
		t.Fatal("a limit without override is not itself")
	}
	if a := testing.AllocsPerRun(100, func() { q.Limit(l); q.Limit(other) }); a != 0 {
		t.Fatalf("Limit allocates %v times", a)
	}
	// Keys with the same override of l share one limit; another quota or
	// unit is another limit.
	same := mkQuota("k2", "pro", quota.Override{Descriptor: "tier:pro", RequestsPerUnit: 7, Unit: rules.Hour}).Plan()
	more := mkQuota("k3", "pro", quota.Override{Descriptor: "tier:pro", RequestsPerUnit: 8, Unit: rules.Hour}).Plan()
	perMinute := mkQuota("k4", "pro", quota.Override{Descriptor: "tier:pro", RequestsPerUnit: 7, Unit: rules.Minute}).Plan()
	if same.Limit(l) != got || more.Limit(l) == got || more.Limit(l).Spec.Limit != 8 || perMinute.Limit(l) == got || perMinute.Limit(l).Unit != rules.Minute {
		t.Fatal("limits with the same override are not shared, or different ones are")
	}
}

func TestValidate(t *testing.T) {
	cases := []struct {
		q     *quota.Quota
		field string
	}{
		{&quota.Quota{}, "api_key"},
		{&quota.Quota{APIKey: "a b"}, "api_key"},
		{&quota.Quota{APIKey: string(make([]byte, 65))}, "api_key"},
		{&quota.Quota{APIKey: "k", Tier: "a b"}, "tier"},
		{&quota.Quota{APIKey: "k", Overrides: []quota.Override{{Descriptor: "", RequestsPerUnit: 1, Unit: rules.Minute}}}, "overrides[0].descriptor"},
		{&quota.Quota{APIKey: "k", Overrides: []quota.Override{{Descriptor: "x", RequestsPerUnit: -1, Unit: rules.Minute}}}, "overrides[0].requests_per_unit"},
		{&quota.Quota{APIKey: "k", Overrides: []quota.Override{{Descriptor: "x", RequestsPerUnit: 1, Unit: 9}}}, "overrides[0].unit"},
		{&quota.Quota{APIKey: "k", Overrides: []quota.Override{{Descriptor: "x", RequestsPerUnit: 1}, {Descriptor: "x", RequestsPerUnit: 2}}}, "overrides[1].descriptor"},
		{&quota.Quota{APIKey: "k", EffectiveAt: quota.TimeOf(time.Unix(10, 0)), ExpiresAt: quota.TimeOf(time.Unix(5, 0))}, "expires_at"},
	}
	for _, c := range cases {
		err := c.q.Validate()
		fe, ok := err.(*quota.FieldError)
		if !ok || fe.Field != c.field {
			t.Errorf("%+v: %v, want a FieldError on %s", c.q, err, c.field)
		}
	}
	if err := mkQuota("k", "pro").Validate(); err != nil {
		t.Fatal(err)
	}
}

// benchIndex looks up keys of an index of n quotas (with a change in the
// delta, as after any write), cycling through the first hot keys of a random
// order. The keys to look up are copied into one buffer in lookup order, as
// a request's key sits in its freshly read body: what is measured is the
// index, not the benchmark's own cache misses on scattered strings.
func benchIndex(b *testing.B, n, hot int) {
	var x quota.Index
	all := make([]*quota.Quota, n)
	for i := range all {
		all[i] = mkQuota(fmt.Sprintf("key-%08d", i), "pro")
	}
	x.Replace(all, 1)
	x.Apply([]quota.Change{{APIKey: "changed", Quota: mkQuota("changed", "pro")}}, 2)
	order := rand.New(rand.NewPCG(1, 2)).Perm(n)[:hot]
	var buf []byte
	for _, i := range order {
		buf = fmt.Appendf(buf, "key-%08d", i)
	}
	keys := make([]string, hot)
	all2 := string(buf)
	for i := range keys {
		keys[i] = all2[i*12 : (i+1)*12]
	}
	now := time.Now().UnixNano()
	plain := make(map[string]*quota.Quota, n) // the yardstick: a bare Go map
	for _, q := range all {
		plain[q.APIKey] = q
	}
	// loop looks keys up in turn with lookup, which says whether it found one.
	loop := func(lookup func(string) bool) func(*testing.B) {
		return func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if !lookup(keys[i]) {
					b.Fatal("missing")
				}
				if i++; i == hot {
					i = 0
				}
			}
		}
	}
	index := func(k string) bool { return x.QuotaAt(now, k) != nil }
	runtime.GC() // no collection of the setup's garbage during the timing
	b.Run("index-with-delta", loop(index))
	x.Compact()
	runtime.GC()
	b.Run("index", loop(index))
	// The yardstick of the same run: a bare Go map of the same keys.
	b.Run("gomap", loop(func(k string) bool { q := plain[k]; return q != nil && q.InForceAt(now) }))
}

// BenchmarkQuotaAt is the check path's lookup of a key with a quota: n
// quotas loaded, lookups spread over hot of them in a random order. With a
// few hot keys the table's slots, quotas and keys stay in the CPU's caches
// and what is measured is the lookup's own work (hashing the key, probing,
// comparing, the time checks); with every key of a million (hot=n) nearly
// every lookup misses the caches two or three times (slot, quota, key
// bytes), and memory latency is most of the figure — for the bare Go map
// too, which is why it runs beside the index.
func BenchmarkQuotaAt(b *testing.B) {
	for _, c := range []struct{ n, hot int }{{100_000, 1000}, {1_000_000, 1}, {1_000_000, 1000}, {100_000, 100_000}, {1_000_000, 1_000_000}} {
		b.Run(fmt.Sprintf("loaded=%d/hot=%d", c.n, c.hot), func(b *testing.B) { benchIndex(b, c.n, c.hot) })
	}
}

// BenchmarkQuotaAtMiss is a key without a quota, the common case.
func BenchmarkQuotaAtMiss(b *testing.B) {
	var x quota.Index
	var all []*quota.Quota
	for i := range 100_000 {
		all = append(all, mkQuota(fmt.Sprintf("key-%08d", i), "pro"))
	}
	x.Replace(all, 1)
	now := time.Now().UnixNano()
	b.ReportAllocs()
	for b.Loop() {
		if x.QuotaAt(now, "anonymous-key") != nil {
			b.Fatal("found")
		}
	}
}

// The index agrees with a plain map through a seeded random run of replaces,
// changes (deletes among them), folds and compactions over keys that
// collide in the table's low bits often (a small key space, many versions).
func TestIndexAgainstMap(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 15))
	var x quota.Index
	want := map[string]*quota.Quota{}
	key := func() string { return fmt.Sprint("k", r.IntN(3000)) }
	for step := range 400 {
		switch op := r.IntN(20); {
		case op == 0:
			want = map[string]*quota.Quota{}
			var all []*quota.Quota
			for range r.IntN(2000) {
				q := mkQuota(key(), "pro")
				want[q.APIKey] = q // a key given twice keeps its last quota
				all = append(all, q)
			}
			x.Replace(all, int64(step))
		case op == 1:
			x.Compact()
		default:
			var cs []quota.Change
			for range 1 + r.IntN(300) {
				k := key()
				if r.IntN(3) == 0 {
					delete(want, k)
					cs = append(cs, quota.Change{APIKey: k})
				} else {
					q := mkQuota(k, fmt.Sprint("t", step))
					want[k] = q
					cs = append(cs, quota.Change{APIKey: k, Quota: q})
				}
			}
			x.Apply(cs, int64(step))
		}
		if x.Len() != len(want) || len(x.All()) != len(want) {
			t.Fatalf("step %d: len %d, all %d, want %d", step, x.Len(), len(x.All()), len(want))
		}
		for range 200 {
			k := key()
			if got := x.Get(k); !reflect.DeepEqual(got, want[k]) {
				t.Fatalf("step %d: Get(%s) = %v, want %v", step, k, got, want[k])
			}
		}
		for _, q := range x.All() {
			if !reflect.DeepEqual(want[q.APIKey], q) {
				t.Fatalf("step %d: All holds %s's old quota", step, q.APIKey)
			}
		}
	}
}

// BenchmarkQuotaLimit is the check path's second step for a key with an
// override: the limit that replaces a tier limit (remembered after the first
// check) and a limit the override does not name.
func BenchmarkQuotaLimit(b *testing.B) {
	l := &rules.Limit{Name: "tier:pro", Unit: rules.Minute, Spec: limit.Spec{Algorithm: limit.SlidingWindow, Limit: 100, Window: int64(time.Minute)}}
	other := &rules.Limit{Name: "other", Unit: rules.Minute, Spec: l.Spec}
	q := mkQuota("k", "pro", quota.Override{Descriptor: "tier:pro", RequestsPerUnit: 7, Unit: rules.Hour}).Plan()
	q.Limit(l)
	q.Limit(other)
	b.ReportAllocs()
	for b.Loop() {
		if q.Limit(l) == l || q.Limit(other) != other {
			b.Fatal("wrong limit")
		}
	}
}

// An index of 100k quotas adds (almost) nothing to the heap the garbage
// collector scans on every cycle: its slots and records hold no pointers,
// and the keys' tiers and overrides are a few shared plans. (The index of
// slots with string headers and *Quota made it ~10 MB.)
func TestIndexIsNotScanned(t *testing.T) {
	scannable := func() uint64 {
		runtime.GC()
		runtime.GC()
		s := []metrics.Sample{{Name: "/gc/scan/heap:bytes"}}
		metrics.Read(s)
		return s[0].Value.Uint64()
	}
	var x quota.Index
	build := func() { // the quotas given to Replace are garbage once it returns
		all := make([]*quota.Quota, 100_000)
		for i := range all {
			all[i] = mkQuota(fmt.Sprintf("key-%08d", i), "pro")
			if i%2 == 0 {
				all[i].Overrides = []quota.Override{{Descriptor: "tier:pro", RequestsPerUnit: int64(1000 + i%7), Unit: rules.Minute}}
			}
		}
		x.Replace(all, 1)
	}
	before := scannable()
	build()
	after := scannable()
	if x.Len() != 100_000 || x.QuotaAt(time.Now().UnixNano(), "key-00000002").Overrides[0].RequestsPerUnit != 1002 {
		t.Fatalf("index of %d keys, or key-00000002's override lost", x.Len())
	}
	if grew := int64(after) - int64(before); grew > 256<<10 {
		t.Fatalf("100k quotas added %d bytes of scannable heap; want under 256 KiB", grew)
	}
	if n := quota.PlansForTest(&x); n != 8 {
		t.Fatalf("%d plans for one tier and 7 distinct overrides; want 8", n)
	}
	runtime.KeepAlive(&x)
}

// Keys with the same tier and overrides share one plan (and so one memo of
// the limits they meet); a fold of the delta drops plans no key has any
// more.
func TestIndexSharesPlans(t *testing.T) {
	var x quota.Index
	o := quota.Override{Descriptor: "tier:pro", RequestsPerUnit: 7, Unit: rules.Hour}
	x.Replace([]*quota.Quota{mkQuota("a", "pro", o), mkQuota("b", "pro", o), mkQuota("c", "pro"), mkQuota("d", "free")}, 1)
	now := time.Now().UnixNano()
	a, b, c, d := x.QuotaAt(now, "a"), x.QuotaAt(now, "b"), x.QuotaAt(now, "c"), x.QuotaAt(now, "d")
	if a != b || a == c || c == d || a.Tier != "pro" || d.Tier != "free" || len(a.Overrides) != 1 || len(c.Overrides) != 0 {
		t.Fatalf("plans a %p b %p c %p d %p", a, b, c, d)
	}
	// A change to the same override as a's finds a's plan.
	x.Apply([]quota.Change{{APIKey: "e", Quota: mkQuota("e", "pro", o)}, {APIKey: "d"}}, 2)
	if x.QuotaAt(now, "e") != a || x.QuotaAt(now, "d") != nil {
		t.Fatal("a change did not share a's plan, or d is not deleted")
	}
	if n := quota.PlansForTest(&x); n != 3 {
		t.Fatalf("%d plans before the fold, want 3", n)
	}
	x.Compact() // d's plan ("free") is no key's now
	if n := quota.PlansForTest(&x); n != 2 || x.QuotaAt(now, "a") != a || x.QuotaAt(now, "c") != c {
		t.Fatalf("%d plans after the fold (want 2), or a plan was not kept as it was", n)
	}
	// The quota Get returns is the key's own copy.
	g := x.Get("a")
	g.Overrides[0].RequestsPerUnit = 99
	if x.Get("a").Overrides[0].RequestsPerUnit != 7 || a.Overrides[0].RequestsPerUnit != 7 {
		t.Fatal("Get handed out the plan's overrides")
	}
}

// Readers see every key's quota whole, and never older than a quota they
// saw before, while one writer changes keys, deletes and re-adds others,
// and folds and compacts the delta (run with -race).
func TestIndexConcurrentReaders(t *testing.T) {
	const keys = 2000
	var x quota.Index
	quotaOf := func(k, gen int) *quota.Quota {
		return mkQuota(fmt.Sprint("k", k), fmt.Sprint("t", gen), quota.Override{Descriptor: "tier:pro", RequestsPerUnit: int64(gen), Unit: rules.Minute})
	}
	all := make([]*quota.Quota, keys)
	for k := range all {
		all[k] = quotaOf(k, 0)
	}
	x.Replace(all, 1)
	stop := make(chan struct{})
	errs := make(chan error, 4)
	var wg sync.WaitGroup
	for r := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(r), 1))
			seen := make([]int64, keys)
			for {
				select {
				case <-stop:
					errs <- nil
					return
				default:
				}
				k := rng.IntN(keys)
				p := x.QuotaAt(time.Now().UnixNano(), fmt.Sprint("k", k))
				if p == nil {
					if k%10 != 0 { // only keys k0, k10, … are ever deleted
						errs <- fmt.Errorf("k%d has no quota", k)
						return
					}
					continue
				}
				gen := p.Overrides[0].RequestsPerUnit
				if p.Tier != fmt.Sprint("t", gen) || gen < seen[k] {
					errs <- fmt.Errorf("k%d: tier %s with override %d, after %d", k, p.Tier, gen, seen[k])
					return
				}
				seen[k] = gen
			}
		}()
	}
	rng := rand.New(rand.NewPCG(2, 3))
	for step := 1; step <= 300; step++ {
		var cs []quota.Change
		for range 1 + rng.IntN(100) {
			k := rng.IntN(keys)
			if k%10 == 0 && rng.IntN(2) == 0 {
				cs = append(cs, quota.Change{APIKey: fmt.Sprint("k", k)})
			} else {
				cs = append(cs, quota.Change{APIKey: fmt.Sprint("k", k), Quota: quotaOf(k, step)})
			}
		}
		x.Apply(cs, int64(step+1))
		if step%50 == 0 {
			x.Compact()
		}
	}
	close(stop)
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
}

// Keys of every length are found, whether the slot holds them (up to 15
// bytes) or their record does, and keys that differ only in their last
// byte, or are a prefix of another, are not taken for each other; a key's
// effective_at and expires_at are honoured either way.
func TestIndexKeyLengths(t *testing.T) {
	now := time.Now()
	var all []*quota.Quota
	for n := 1; n <= quota.MaxKeyBytes; n++ {
		q := mkQuota(strings.Repeat("a", n-1)+"b", fmt.Sprint("t", n))
		if n%2 == 0 { // in force only from an hour on
			q.EffectiveAt = quota.TimeOf(now.Add(time.Hour))
		}
		all = append(all, q)
	}
	var x quota.Index
	x.Replace(all, 1)
	x.Apply([]quota.Change{{APIKey: strings.Repeat("z", 20), Quota: mkQuota(strings.Repeat("z", 20), "delta")}}, 2)
	for n := 1; n <= quota.MaxKeyBytes; n++ {
		key := strings.Repeat("a", n-1) + "b"
		for _, at := range []time.Time{now, now.Add(2 * time.Hour)} {
			p := x.QuotaAt(at.UnixNano(), key)
			if want := n%2 == 1 || at.After(now); (p != nil) != want || (p != nil && p.Tier != fmt.Sprint("t", n)) {
				t.Fatalf("key of %d bytes at %v: plan %+v, want in force %v", n, at.Sub(now), p, want)
			}
		}
		for _, other := range []string{strings.Repeat("a", n-1) + "c", strings.Repeat("a", n), key + "b", "x" + key} {
			if got := x.Get(other); got != nil {
				t.Fatalf("%q found as %q", other, got.APIKey)
			}
		}
	}
	if p := x.QuotaAt(now.UnixNano(), strings.Repeat("z", 20)); p == nil || p.Tier != "delta" {
		t.Fatalf("the delta's long key: %+v", p)
	}
}

// The snapshot file is written straight from the index, base and delta,
// without a copy of each quota (the Syncer saves after every change), and
// reads back as the index's quotas.
func TestIndexSnapshotWrite(t *testing.T) {
	var x quota.Index
	var all []*quota.Quota
	for i := range 10_000 {
		q := mkQuota(fmt.Sprintf("key-%08d-and-more", i), "pro")
		if i%3 == 0 {
			q.Overrides = []quota.Override{{Descriptor: "tier:pro", RequestsPerUnit: int64(i % 5), Unit: rules.Minute}}
		}
		all = append(all, q)
	}
	x.Replace(all, 1)
	x.Apply([]quota.Change{{APIKey: "key-00000001-and-more"}, {APIKey: "new", Quota: mkQuota("new", "free")}}, 2)
	var buf bytes.Buffer
	allocs := testing.AllocsPerRun(3, func() {
		buf.Reset()
		if err := quota.EncodeIndexForTest(&buf, &x); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 100 {
		t.Fatalf("writing a snapshot of 10k quotas allocates %v times", allocs)
	}
	body := buf.Bytes()[:buf.Len()-4] // without the checksum
	got, v, err := quota.DecodeSnapshotBodyForTest(body)
	if err != nil || v != 2 || len(got) != x.Len() {
		t.Fatalf("read back %d quotas at version %d (%v), want %d at 2", len(got), v, err, x.Len())
	}
	for _, q := range got {
		if want := x.Get(q.APIKey); !reflect.DeepEqual(q, want) {
			t.Fatalf("%s: read back %+v, want %+v", q.APIKey, q, want)
		}
	}
}
