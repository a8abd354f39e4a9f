package simulate

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/edgelimit/edgelimit/crdt"
	"github.com/edgelimit/edgelimit/pop"
	"github.com/edgelimit/edgelimit/pop/limit"
	"github.com/edgelimit/edgelimit/pop/rules"
	"github.com/edgelimit/edgelimit/pop/store"
	edgelimitpb "github.com/edgelimit/edgelimit/proto"
	"github.com/edgelimit/edgelimit/region"
	"github.com/edgelimit/edgelimit/replication/core"
)

// Strategy is a way of enforcing one limit across PoPs.
type Strategy uint8

const (
	// Edgelimit is edgelimit as built: a global-scope limit in every PoP's
	// embedded store, CRDT deltas flushed every FlushInterval through the
	// simulated network and joined by the other PoPs; each check also counts
	// the hits other PoPs probably admitted since their last message
	// (MemoryConfig.Extrapolate); every admitted hit makes the PoP publish
	// its delta at once (store.Memory.Urgent, at most once per
	// BitsInterval); and mitigation bits: a PoP that finds the
	// key over the limit issues a bit, published at once, and every PoP that
	// holds it denies without counting until the bit ends.
	Edgelimit Strategy = iota
	// AsyncSync is the plain asynchronous baseline, edgelimit before the
	// mechanisms above: CRDT deltas every FlushInterval only, decisions on
	// the counts heard.
	AsyncSync
	// LocalOnly lets each PoP enforce the whole limit on its own traffic.
	LocalOnly
	// StaticSplit gives each of the N PoPs limit/N (the remainder to the first
	// PoPs), enforced locally.
	StaticSplit
	// Centralized decides every request in one shared store: exact, but each
	// decision costs the round trip from the PoP's region to the first region.
	Centralized
)

// Strategies lists every strategy in report order.
var Strategies = []Strategy{Edgelimit, AsyncSync, LocalOnly, StaticSplit, Centralized}

var strategyNames = [...]string{"edgelimit", "async-sync", "local-only", "static-split", "centralized"}

func (s Strategy) String() string {
	if int(s) < len(strategyNames) {
		return strategyNames[s]
	}
	return fmt.Sprintf("Strategy(%d)", s)
}

// Epoch is the wall-clock instant virtual time 0 stands for: midnight UTC,
// so every limit unit's windows start at virtual multiples of the unit.
var Epoch = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

// Random streams drawn from the scenario's seed. Traffic has its own stream so
// that every strategy sees the very same arrivals whatever its network draws;
// a mix's population has another, drawn once per run.
const (
	streamTraffic = 1
	streamNetwork = 2
	streamMix     = 3
)

const (
	simDomain = "sim"
	simKey    = "client"
	// seriesPoints is about how many samples Result.Series holds.
	seriesPoints = 240
	// convergeStep is how often, after a partition heals, a run checks
	// whether every PoP holds every other PoP's counts from before the heal.
	convergeStep = int64(5 * time.Millisecond)
	// prefetchAhead is how many requests ahead a run starts fetching the
	// oracle's state of a request's key.
	prefetchAhead = 4
	// bitSweepInterval is how often a PoP drops ended mitigation bits, as
	// `edgelimit pop` does.
	bitSweepInterval = int64(time.Second)
)

// source is a Source, or a generated one of a Mix, in index form.
type source struct {
	rate                float64
	spread              Spread
	pop                 int // an anycast source's PoP
	start, end, on, off int64
	key                 int
	// rateEnd, when above 0, is the rate at end: the rate ramps linearly
	// from rate at start (Source.RateEnd).
	rateEnd float64
}

// population expands the scenario's sources and mix into sources and the
// distinct keys they use, in order of first use.
func population(sc *Scenario, top *topology, limitRate float64) ([]source, []string) {
	var srcs []source
	var keys []string
	keyIdx := map[string]int{}
	n := len(top.pops)
	for i, s := range sc.Sources {
		ki, ok := keyIdx[s.Key]
		if !ok {
			ki = len(keys)
			keyIdx[s.Key] = ki
			keys = append(keys, s.Key)
		}
		p := i % n
		if s.PoP != "" {
			p = slices.Index(top.pops, s.PoP)
		}
		srcs = append(srcs, source{
			rate: s.Rate, spread: s.Spread, pop: p, key: ki,
			start: int64(s.Start), end: int64(s.End), on: int64(s.On), off: int64(s.Off),
			rateEnd: s.RateEnd,
		})
	}
	m := sc.Mix
	if m == nil {
		return srcs, keys
	}
	rnd := rand.New(rand.NewPCG(sc.Seed, streamMix))
	// Spreads in a fixed order: ranging over the map would not replay.
	var spreads []Spread
	var weights []float64
	total := 0.0
	for _, sp := range []Spread{Anycast, Spray, Random} {
		if w := m.Spread[sp]; w > 0 {
			spreads, weights = append(spreads, sp), append(weights, w)
			total += w
		}
	}
	xm := m.MeanRate * (m.Alpha - 1) / m.Alpha // Pareto scale for that mean
	dur := int64(sc.Duration)
	for i := range m.Sources {
		s := source{spread: Anycast, pop: rnd.IntN(n), key: len(keys), end: dur}
		keys = append(keys, mixKey(i))
		if len(spreads) > 0 {
			x := rnd.Float64() * total
			for j, w := range weights {
				if x < w || j == len(weights)-1 {
					s.spread = spreads[j]
					break
				}
				x -= w
			}
		}
		if rnd.Float64() < m.Abusive {
			lo, hi := math.Log(m.AbuseMin), math.Log(m.AbuseMax)
			s.rate = limitRate * math.Exp(lo+rnd.Float64()*(hi-lo))
			span := min(int64(m.AbuseFor), dur)
			s.start = rnd.Int64N(dur - span + 1)
			s.end = s.start + span
		} else {
			s.rate = min(xm/math.Pow(1-rnd.Float64(), 1/m.Alpha), m.MaxRate)
		}
		srcs = append(srcs, s)
	}
	return srcs, keys
}

// offered is the mean number of requests s sends over the run.
func (s *source) offered() float64 {
	active := float64(s.end-s.start) / float64(time.Second)
	if s.on > 0 {
		active *= float64(s.on) / float64(s.on+s.off)
	}
	if s.ramps() { // the mean rate; with on/off phases, about
		return (s.rate + s.rateEnd) / 2 * active
	}
	return s.rate * active
}

// tracked returns the key with the most offered traffic (the first on ties).
func tracked(srcs []source, keys int) int {
	offered := make([]float64, keys)
	for i := range srcs {
		offered[srcs[i].key] += srcs[i].offered()
	}
	best := 0
	for k, v := range offered {
		if v > offered[best] {
			best = k
		}
	}
	return best
}

// topology is a scenario's PoPs and network in index form.
type topology struct {
	pops    []string
	region  []int // region index of each PoP
	regions []string
	peers   [][]string // other PoPs of each PoP's region
	base    [][]int64  // one-way latency between regions, ns
	jitter  [][]int64
	loss    [][]float64 // between two regions: Scenario.Loss or the link's own
	cuts    []cut
}

type cut struct {
	from, to   int
	start, end int64
	oneWay     bool
}

func newTopology(sc *Scenario) *topology {
	t := &topology{}
	idx := map[string]int{}
	for ri, r := range sc.Regions {
		idx[r.Name] = ri
		t.regions = append(t.regions, r.Name)
		for _, p := range r.PoPs {
			t.pops = append(t.pops, p)
			t.region = append(t.region, ri)
		}
	}
	for _, p := range t.pops {
		var peers []string
		for _, q := range sc.Regions[t.region[len(t.peers)]].PoPs {
			if q != p {
				peers = append(peers, q)
			}
		}
		t.peers = append(t.peers, peers)
	}
	n := len(t.regions)
	t.base, t.jitter, t.loss = make([][]int64, n), make([][]int64, n), make([][]float64, n)
	for i := range n {
		t.base[i], t.jitter[i], t.loss[i] = make([]int64, n), make([]int64, n), make([]float64, n)
		for j := range n {
			if j != i {
				t.loss[i][j] = sc.Loss
			}
		}
	}
	for _, l := range sc.Latency {
		a, b := idx[l.From], idx[l.To]
		ms := func(v float64) int64 { return int64(math.Round(v * float64(time.Millisecond))) }
		t.base[a][b], t.base[b][a] = ms(l.Ms), ms(l.Ms)
		t.jitter[a][b], t.jitter[b][a] = ms(l.JitterMs), ms(l.JitterMs)
		if l.Loss != nil && a != b {
			t.loss[a][b], t.loss[b][a] = *l.Loss, *l.Loss
		}
	}
	for _, p := range sc.Partitions {
		t.cuts = append(t.cuts, cut{idx[p.From], idx[p.To], int64(p.Start), int64(p.End), p.OneWay})
	}
	return t
}

// healAt returns when the link from region a to region b, cut at now, heals,
// or now when it is not cut.
func (t *topology) healAt(a, b int, now int64) int64 {
	heal := now
	for changed := true; changed; { // overlapping cuts chain
		changed = false
		for _, c := range t.cuts {
			match := (c.from == a && c.to == b) || (!c.oneWay && c.from == b && c.to == a)
			if match && c.start <= heal && heal < c.end {
				heal, changed = c.end, true
			}
		}
	}
	return heal
}

// message is one message of the replication core on its way from PoP from,
// with when each bit it carries was issued (true time).
type message struct {
	from     int
	m        core.Message
	issuedAt []int64
	got      []bool // per PoP: a copy with bits was applied (duplicates are not sampled twice)
}

// run is one strategy's simulation of a scenario.
type run struct {
	sc       *Scenario
	top      *topology
	strategy Strategy
	q        *queue  // virtual clock and network randomness
	arrivals *reader // the requests, shared with the other strategies' runs
	names    keyNames

	engines    []*pop.Engine // per PoP; all the same engine when centralized
	stores     []*store.Memory
	mits       []*pop.Mitigations // per PoP, Edgelimit only
	replicated bool               // Edgelimit or AsyncSync: counts cross the network
	oracle     *oracle
	skew       []int64 // per PoP clock offset from true time: its raw skew plus its core's correction
	rawSkew    []int64 // per PoP raw clock offset, from the scenario

	req pop.Request
	res pop.Result

	messages, bytes int64
	linkFree        [][]int64 // per pair of regions: when the link delivers its latest message (linkAt)
	directFree      [][]int64 // per region and PoP, the same for the PoP's direct path (Scenario.Direct), nil without one
	pubAt           []int64   // publish's scratch: per region, when the message arrives there
	latencyNs       int64     // Σ added decision latency (centralized, strong)
	latencyHist     []int64   // decisions by added latency, in latencyBucket steps; the last holds the rest
	lastSweep       []int64
	lastBitSweep    []int64

	cores      []*core.Core      // per PoP, when replicated: the replication protocol
	strongs    []*store.Strong   // per PoP, when the limit is strong: its home side and asker
	popIndex   map[string]int    // PoP name → index
	waited     int64             // the added latency of the decision being made
	wait       int64             // how long a check may wait for bounded allowance (Scenario.BoundedWait); 0: never
	waiting    waitingChecks     // the checks waiting for bounded allowance (boundedwait.go)
	tickAt     []int64           // per PoP: when its scheduled evTick fires
	urgent     []<-chan struct{} // per PoP: its store's near-limit news, nil when it has none
	delivering *message          // the message being delivered, while its Ready is done
	share      []float64         // per PoP: the global share it enforces
	reduced    int64             // decisions made at a reduced share
	rejected   int64             // what the cores' receiver checks refused or clamped

	issuedAt  [][]int64 // per PoP: issue times of bits not yet published
	bitDelays []int64   // issue → delivery at another PoP, per bit and PoP

	heals       []healState
	convergence []int64
	unconverged int

	window, duration, maxSkew int64
	progress                  func(virtual int64)
}

// healState is what every PoP owned when a partition healed, to tell when
// all of it has reached every other PoP.
type healState struct {
	at   int64
	own  [][]crdt.Slot // per PoP
	done bool
}

// Options tune how a run reports on itself; they never change its result.
type Options struct {
	// Progress, when set, is called now and then during the run with the
	// simulated time done so far and the total, summed over strategies.
	// It may be called from several goroutines at once.
	Progress func(done, total time.Duration)
}

// Run simulates sc under every strategy and reports how each did. It fails
// only on an invalid scenario or a failing engine.
func Run(sc Scenario) (Report, error) { return RunWith(sc, Options{}) }

// RunWith is Run with options. Strategies run concurrently, one goroutine
// each; each run is single-threaded and deterministic, so the report does
// not depend on how they interleave.
func RunWith(sc Scenario, opt Options) (Report, error) {
	// Validate fills in defaults: on copies, so that the caller's scenario
	// is never written to.
	sc.Sources = slices.Clone(sc.Sources)
	sc.Regions = slices.Clone(sc.Regions)
	if sc.Mix != nil {
		m := *sc.Mix
		sc.Mix = &m
	}
	if err := sc.Validate(); err != nil {
		return Report{}, fmt.Errorf("simulate: %w", err)
	}
	spec, _, _ := sc.Limit.spec()
	top := newTopology(&sc)
	limitRate := float64(spec.Limit) / time.Duration(spec.Window).Seconds()
	srcs, keys := population(&sc, top, limitRate)
	tk := tracked(srcs, len(keys))
	step := max(int64(sc.Duration)/seriesPoints, int64(time.Millisecond))
	rep := Report{
		Scenario: sc.Name, Seed: sc.Seed, Duration: sc.Duration,
		Limit: spec.Limit, Unit: sc.Limit.Unit, Algorithm: sc.Limit.Algorithm,
		PoPs: len(top.pops), Regions: len(top.regions),
		FlushInterval: sc.FlushInterval,
		Direct:        sc.Direct,
		Sources:       len(srcs), Keys: len(keys), Tracked: keys[tk],
		SeriesStep:    time.Duration(step),
		EventualBound: eventualBound(&sc, top, srcs, len(keys), spec.Limit),
		Partitions:    sc.Partitions,
	}
	for i := range srcs {
		rep.OfferedPerSecond += srcs[i].offered()
	}
	rep.OfferedPerSecond /= sc.Duration.Seconds()

	var done atomic.Int64
	total := time.Duration(int64(len(Strategies)) * int64(sc.Duration))
	rep.Results = make([]Result, len(Strategies))
	errs := make([]error, len(Strategies))
	// All strategies run at once: they read one traffic, and a run that is
	// ahead waits for the slowest (see traffic).
	tr := newTraffic(sc.Seed, srcs, len(top.pops), int64(sc.Duration), len(Strategies))
	var wg sync.WaitGroup
	for i, st := range Strategies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var progress func(int64)
			if opt.Progress != nil {
				progress = func(d int64) { opt.Progress(time.Duration(done.Add(d)), total) }
			}
			arrivals := &reader{t: tr, id: i}
			defer arrivals.close()
			rep.Results[i], errs[i] = runStrategy(&sc, top, arrivals, keys, tk, step, st, progress)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return Report{}, err
	}
	return rep, nil
}

// runStrategy simulates sc under st, on the requests arrivals reads; keys
// names the keys, tk is the tracked one.
func runStrategy(sc *Scenario, top *topology, arrivals *reader, keys []string, tk int, step int64, st Strategy, progress func(int64)) (Result, error) {
	spec, unit, _ := sc.Limit.spec()
	n := len(top.pops)
	named := len(keys)
	if sc.Mix != nil {
		named -= sc.Mix.Sources
	}
	r := &run{
		sc: sc, top: top, strategy: st,
		q:          newQueue(sc.Seed, streamNetwork),
		arrivals:   arrivals,
		names:      keyNames{named: keys[:named]},
		oracle:     newOracle(spec.Window, spec.Limit, len(keys), tk, step, int64(sc.Duration)),
		skew:       make([]int64, n),
		rawSkew:    make([]int64, n),
		window:     spec.Window,
		duration:   int64(sc.Duration),
		replicated: st == Edgelimit || st == AsyncSync,
		progress:   progress,
	}
	for i, p := range top.pops {
		r.skew[i] = int64(sc.ClockSkew[p])
		r.rawSkew[i] = r.skew[i]
		r.maxSkew = max(r.maxSkew, r.skew[i])
	}
	r.req = pop.Request{Domain: simDomain, Descriptors: []pop.Descriptor{{Entries: []rules.Entry{{Key: simKey}}}}}
	maxKeys := 2*len(keys) + 1024
	consistency, _ := sc.Limit.consistency()
	if consistency == limit.Strong && r.replicated {
		r.strongs = make([]*store.Strong, n)
		r.popIndex = map[string]int{}
		for i, p := range top.pops {
			r.popIndex[p] = i
		}
	}
	if consistency == limit.Bounded && r.replicated {
		r.wait = int64(boundedWait(sc))
	}
	newEngine := func(limit int64, scope rules.Scope, cfg store.MemoryConfig) (*pop.Engine, *store.Memory, error) {
		s := spec
		s.Limit = limit
		root := &rules.Node{}
		l := &rules.Limit{Domain: simDomain, Path: simKey, Name: simKey, Unit: unit, Spec: s, Scope: scope}
		if scope != rules.ScopePOP {
			l.Consistency = consistency
		}
		root.Child(simKey, "").Add(l)
		set, err := rules.NewSet(rules.NewDomain(simDomain, "simulate", root))
		if err != nil {
			return nil, nil, fmt.Errorf("simulate: rules: %w", err)
		}
		cfg.MaxKeys = maxKeys
		m := store.NewMemory(cfg)
		if r.strongs != nil && scope != rules.ScopePOP {
			i := r.popIndex[cfg.Replica]
			st, err := store.NewStrong(m, store.StrongConfig{Self: cfg.Replica, Region: top.regions[top.region[i]],
				Regions: sc.regionMap(), Asker: &simAsker{r: r, from: i}, PartitionShare: sc.PartitionShare})
			if err != nil {
				return nil, nil, fmt.Errorf("simulate: %w", err)
			}
			r.strongs[i] = st
			e := pop.NewEngine(st, set, nil)
			st.UseGlobalShare(e.GlobalShare)
			return e, m, nil
		}
		e := pop.NewEngine(m, set, nil)
		if scope != rules.ScopePOP && r.wait > 0 {
			e.UseAllowanceWait(m, time.Duration(r.wait))
		}
		return e, m, nil
	}
	r.engines, r.stores = make([]*pop.Engine, n), make([]*store.Memory, n)
	for i := range n {
		var err error
		switch st {
		case Edgelimit, AsyncSync:
			r.engines[i], r.stores[i], err = newEngine(spec.Limit, rules.ScopeGlobal,
				store.MemoryConfig{Replica: top.pops[i], RegionPeers: top.peers[i], Replicas: top.pops, Extrapolate: st == Edgelimit})
			if st == Edgelimit && err == nil {
				if r.mits == nil {
					r.mits = make([]*pop.Mitigations, n)
					r.issuedAt = make([][]int64, n)
				}
				r.mits[i] = pop.NewMitigations(top.pops[i])
				r.engines[i].UseMitigations(r.mits[i])
			}
		case LocalOnly:
			r.engines[i], r.stores[i], err = newEngine(spec.Limit, rules.ScopePOP, store.MemoryConfig{})
		case StaticSplit:
			share := spec.Limit / int64(n)
			if int64(i) < spec.Limit%int64(n) {
				share++
			}
			if share == 0 {
				return Result{}, fmt.Errorf("simulate: static split: limit %d is below the number of PoPs %d", spec.Limit, n)
			}
			r.engines[i], r.stores[i], err = newEngine(share, rules.ScopePOP, store.MemoryConfig{})
		case Centralized:
			if i == 0 {
				r.engines[i], r.stores[i], err = newEngine(spec.Limit, rules.ScopePOP, store.MemoryConfig{})
			} else {
				r.engines[i], r.stores[i] = r.engines[0], r.stores[0]
			}
		}
		if err != nil {
			return Result{}, err
		}
	}

	if r.replicated {
		if err := r.startCores(); err != nil {
			return Result{}, err
		}
		for i, p := range sc.Partitions {
			if int64(p.End) < r.duration {
				r.q.schedule(event{at: int64(p.End), kind: evHeal, idx: i})
			}
		}
	}
	if err := r.loop(context.Background()); err != nil {
		return Result{}, err
	}
	r.oracle.finish()
	return r.result(), nil
}

// loop fires events until the run's end.
func (r *run) loop(ctx context.Context) error {
	const progressEvery = 1 << 16
	reported, events := int64(0), 0
	for {
		// The next request, unless an event comes strictly before it.
		a, ok := r.arrivals.peek()
		if ok && (len(r.q.h) == 0 || a.at <= r.q.h[0].at) {
			r.q.now = a.at
			r.arrivals.take()
			// The oracle's first touch of a key is a cache miss with
			// hundreds of thousands of keys; the requests are known
			// ahead, so start it a few requests early.
			if next, ok := r.arrivals.ahead(prefetchAhead); ok {
				r.oracle.prefetch(int(next.key))
			}
			if err := r.arrive(ctx, int(a.key), int(a.pop)); err != nil {
				return err
			}
		} else {
			e, ok := r.q.next()
			if !ok || e.at >= r.duration {
				break
			}
			if err := r.fire(e); err != nil {
				return err
			}
		}
		if events++; r.progress != nil && events%progressEvery == 0 {
			r.progress(r.q.now - reported)
			reported = r.q.now
		}
	}
	if err := r.finishWaiting(); err != nil {
		return err
	}
	for i := range r.heals {
		if !r.heals[i].done {
			r.unconverged++
		}
	}
	if r.progress != nil {
		r.progress(r.duration - reported)
	}
	return nil
}

// fire does what event e says.
func (r *run) fire(e event) error {
	switch e.kind {
	case evTick:
		if e.at == r.tickAt[e.idx] { // else a later or earlier tick replaced it
			r.tick(e.idx)
		}
	case evDeliver:
		return r.deliver(e.idx, e.msg)
	case evWaited:
		return r.waitedOut(e.idx)
	case evHeal:
		h := healState{at: r.q.now, own: make([][]crdt.Slot, len(r.stores))}
		for i, s := range r.stores {
			h.own[i] = s.Own()
		}
		r.heals = append(r.heals, h)
		r.q.schedule(event{at: r.q.now, kind: evConverge, idx: len(r.heals) - 1})
	case evConverge:
		r.converge(e.idx)
	}
	return nil
}

// startCores starts one replication core per PoP, each as if its PoP had
// booted at a random recent instant, so that the PoPs' flushes, beacons and
// snapshots do not fall in step.
func (r *run) startCores() error {
	n := len(r.top.pops)
	t := region.Topology{Regions: map[string][]string{}}
	for _, rg := range r.sc.Regions {
		t.Regions[rg.Name] = rg.PoPs
	}
	r.cores, r.tickAt, r.urgent = make([]*core.Core, n), make([]int64, n), make([]<-chan struct{}, n)
	r.lastSweep, r.lastBitSweep, r.share = make([]int64, n), make([]int64, n), make([]float64, n)
	r.linkFree, r.pubAt = grid(len(r.top.regions), len(r.top.regions)), make([]int64, len(r.top.regions))
	if r.sc.Direct && r.strategy == Edgelimit {
		r.directFree = grid(len(r.top.regions), n)
	}
	for i := range n {
		r.share[i] = 1
		cfg := core.Config{
			Region: r.top.regions[r.top.region[i]], POP: r.top.pops[i], Topology: t, Counts: r.stores[i],
			FlushInterval: r.sc.FlushInterval, SnapshotInterval: r.sc.SnapshotInterval, HelloInterval: r.sc.HelloInterval,
			BitsInterval: r.sc.BitsInterval, UnreachableAfter: r.sc.UnreachableAfter, PartitionShare: r.sc.PartitionShare,
			Bounds: r.engines[i].ReplicaBounds(),
			// The plain asynchronous baseline keeps each PoP on its own clock.
			NoClockSync: r.strategy != Edgelimit,
		}
		if r.mits != nil {
			cfg.Bits = r.mits[i]
		}
		if u, ok := any(r.stores[i]).(core.UrgentNotifier); ok && r.strategy == Edgelimit {
			r.urgent[i] = u.Urgent()
		}
		// Booted long enough ago for its phases to differ from the other
		// PoPs', not so long that it took the other regions for cut off
		// before their first beacons can arrive.
		boot := r.clock(i) - r.q.rand.Int64N(int64(min(r.sc.SnapshotInterval, r.sc.UnreachableAfter/2)))
		c, err := core.New(cfg, boot)
		if err != nil {
			return fmt.Errorf("simulate: %w", err)
		}
		r.cores[i] = c
		r.tickAt[i] = math.MaxInt64
		r.reschedule(i)
	}
	return nil
}

// clock is PoP p's wall clock now, in unix ns: the virtual time on the
// Epoch, plus its skew and its core's correction.
func (r *run) clock(p int) int64 { return Epoch.UnixNano() + r.q.now + r.skew[p] }

// reschedule makes sure an evTick fires for PoP p at its core's next
// deadline.
func (r *run) reschedule(p int) {
	d := r.cores[p].NextDeadline()
	if d == math.MaxInt64 {
		return
	}
	at := max(d-Epoch.UnixNano()-r.skew[p], r.q.now)
	if at < r.tickAt[p] {
		r.tickAt[p] = at
		r.q.schedule(event{at: at, kind: evTick, idx: p})
	}
}

// tick runs PoP p's core at its deadline, sweeps its store once a window and
// drops its ended bits once a second, as `edgelimit pop` does.
func (r *run) tick(p int) {
	r.tickAt[p] = math.MaxInt64
	r.cores[p].Tick(r.clock(p))
	now := r.q.now
	if now-r.lastSweep[p] >= r.window {
		r.stores[p].SweepAt(r.clock(p))
		r.lastSweep[p] = now
	}
	if r.mits != nil && now-r.lastBitSweep[p] >= bitSweepInterval {
		r.mits[p].Sweep(r.clock(p))
		r.lastBitSweep[p] = now
	}
	r.ready(p)
}

// ready does what PoP p's core asks: publish its messages on the simulated
// network, apply what it received, rescale its global limits; then it
// schedules the core's next tick. The in-process store needs nothing saved.
func (r *run) ready(p int) {
	c := r.cores[p]
	for c.HasReady() {
		rd := c.Ready()
		for _, m := range rd.Messages {
			r.publish(p, m)
		}
		for _, a := range rd.Apply {
			if a.Kind == core.Hello {
				r.stores[p].BeaconAt(r.clock(p), a.POP)
				continue
			}
			if len(a.Slots) > 0 {
				r.stores[p].ApplyAt(r.clock(p), a.Sent, a.Slots)
			}
			if len(a.Bits) > 0 {
				r.mits[p].ApplyBits(a.Bits)
				if msg := r.delivering; msg != nil && msg.got != nil && !msg.got[p] {
					msg.got[p] = true
					for _, t := range msg.issuedAt {
						r.bitDelays = append(r.bitDelays, r.q.now-t)
					}
				}
			}
		}
		if rd.Share != 0 {
			r.engines[p].SetGlobalShare(rd.Share)
			r.share[p] = rd.Share
		}
		for _, n := range rd.Rejected {
			r.rejected += int64(n)
		}
		if rd.ClockChanged {
			old := r.skew[p]
			r.skew[p] = r.rawSkew[p] + rd.ClockOffset
			r.stores[p].MoveClock(r.clock(p), r.skew[p]-old)
			if r.strongs != nil && r.strongs[p] != nil {
				// Its home counters move with the clock too; on a
				// store.Memory, which never fails, it cannot fail.
				_ = r.strongs[p].MoveClock(context.Background(), r.clock(p), r.skew[p]-old)
			}
		}
		c.Advance(rd)
		if r.replicated && r.urgent[p] != nil {
			// What it applied may ask for an early flush (a bounded
			// limit's Ledger.Wanted), as the replicator hears at once.
			select {
			case <-r.urgent[p]:
				c.Urgent(r.clock(p))
			default:
			}
		}
	}
	r.reschedule(p)
}

// deliver hands msg to PoP p's core.
func (r *run) deliver(p int, msg *message) error {
	r.cores[p].Step(r.clock(p), msg.m)
	r.delivering = msg
	r.ready(p)
	r.delivering = nil
	return r.wake(p)
}

// converge checks whether every PoP now holds every other PoP's counts as
// they were when partition heal h healed, and records how long that took;
// otherwise it checks again convergeStep later.
func (r *run) converge(h int) {
	hs := &r.heals[h]
	// Windows every PoP still keeps, whatever its clock: those from the one
	// before the current one on the fastest clock.
	horizon := limit.WindowStart(Epoch.UnixNano()+r.q.now+r.maxSkew, r.window) - r.window
	type slotKey struct {
		key     string
		window  int64
		replica string
	}
	for j, s := range r.stores {
		held := map[slotKey]uint64{}
		for _, sl := range s.Remote() {
			held[slotKey{sl.Key, sl.Window, sl.Replica}] = sl.Count
		}
		for q, own := range hs.own {
			if q == j {
				continue
			}
			for _, sl := range own {
				if sl.Window >= horizon && held[slotKey{sl.Key, sl.Window, sl.Replica}] < sl.Count {
					if next := r.q.now + convergeStep; next < r.duration {
						r.q.schedule(event{at: next, kind: evConverge, idx: h})
					}
					return
				}
			}
		}
	}
	hs.done = true
	r.convergence = append(r.convergence, r.q.now-hs.at)
}

// arrive decides a request on key k at PoP p and grades the decision, or,
// when it waits for bounded allowance, sets it waiting (boundedwait.go).
func (r *run) arrive(ctx context.Context, k, p int) error {
	return r.decide(ctx, k, p, r.q.now, r.wait > 0)
}

// decide decides a request on key k that arrived at PoP p at arrived, now,
// and grades the decision; with mayWait, a request that may be admitted by
// waiting for bounded allowance waits instead (boundedwait.go).
func (r *run) decide(ctx context.Context, k, p int, arrived int64, mayWait bool) error {
	now := r.q.now
	var issued uint64
	if r.mits != nil {
		issued = r.mits[p].Stats().Issued
	}
	r.req.Descriptors[0].Entries[0].Value = r.names.name(k) // the engine copies it
	clock := r.skew[p]
	if r.strategy == Centralized {
		clock = r.skew[0] // the central store decides on its own clock
	}
	r.waited = 0
	await, err := r.engines[p].DecideAt(ctx, Epoch.Add(time.Duration(now+clock)), &r.req, &r.res, mayWait, arrived != now)
	if err != nil {
		return fmt.Errorf("simulate: %s at %v: %w", r.strategy, time.Duration(now), err)
	}
	if r.mits != nil {
		issued = r.mits[p].Stats().Issued - issued // the bits this check issued
	}
	if issued > 0 {
		for range issued {
			r.issuedAt[p] = append(r.issuedAt[p], now)
		}
		r.cores[p].BitsIssued(r.clock(p))
		r.ready(p)
	}
	if r.replicated && r.urgent[p] != nil {
		select {
		case <-r.urgent[p]:
			r.cores[p].Urgent(r.clock(p))
			r.ready(p)
		default:
		}
	}
	if await != nil {
		r.await(k, p, arrived, await)
		return nil
	}

	r.oracle.decide(k, now, 1, r.res.Code == pop.OK)
	if r.strategy == Centralized {
		r.waited = 2 * r.top.base[r.top.region[p]][0]
	}
	r.addLatency(r.waited + now - arrived)
	if r.replicated && r.share[p] < 1 {
		r.reduced++
	}
	return nil
}

// publish sends m from PoP p to every other PoP, as NATS would deliver it.
// A delta, snapshot or bits batch goes as JetStream carries it: after the
// latency between the regions (plus jitter), held across a cut link until it
// heals, and duplicated to a PoP with probability Duplicate. A presence
// beacon goes on core NATS: lost, not held, on a cut link. Every message
// crosses its link as linkAt says (in order; late when lost). Every copy
// handed to the network counts as a message on the wire, sized as the
// protobuf message that carries it.
func (r *run) publish(p int, m core.Message) {
	a := r.top.region[p]
	for b := range r.pubAt {
		r.pubAt[b] = -1 // not worked out yet
	}
	// when is when the PoPs of region b get the message, or -2 never.
	when := func(b int, held bool) int64 {
		if r.pubAt[b] == -1 {
			r.pubAt[b] = r.linkAt(r.linkFree[a], b, a, b, held)
		}
		return r.pubAt[b]
	}
	// direct is when PoP j gets the message's copy on its own direct
	// connection to region a, or -2 never: a core NATS message, lost on a
	// cut link; none within a region, whose PoPs share their servers.
	direct := func(j int) int64 {
		b := r.top.region[j]
		if b == a {
			return -2
		}
		return r.linkAt(r.directFree[a], j, a, b, false)
	}
	if m.Kind == core.Hello {
		msg := &message{from: p, m: m}
		size := int64(len(core.AppendBeacon(nil, m)))
		for j := range r.top.pops {
			if j == p {
				continue
			}
			r.messages++
			r.bytes += size
			if at := when(r.top.region[j], false); at >= 0 {
				r.q.schedule(event{at: at, kind: evDeliver, idx: j, msg: msg})
			}
		}
		return
	}
	var size int64
	if m.Kind != core.BitsBatch {
		size = int64(wireSize(m.POP, m.Region, m.Seq, m.Sent, m.Slots))
	}
	msg := &message{from: p, m: m}
	if len(m.Bits) > 0 {
		size += int64(bitsSize(m.POP, m.Bits))
		msg.got = make([]bool, len(r.top.pops))
		if m.Kind == core.BitsBatch {
			// BitsDelta lists bits in the order Issue took them, the order
			// arrive recorded their times.
			msg.issuedAt = r.issuedAt[p][:min(len(m.Bits), len(r.issuedAt[p]))]
			r.issuedAt[p] = nil
		}
	}
	// The direct path carries bits, and of a delta the slots of keys near
	// their limit (store.Memory.Hot), as replication.Replicator publishes
	// them on the hot subject.
	var hot *message
	var hotSize int64
	if r.directFree != nil {
		switch m.Kind {
		case core.BitsBatch:
			hot, hotSize = msg, size
		case core.Delta:
			if slots := r.stores[p].Hot(m.Slots); len(slots) > 0 {
				hm := m
				hm.Slots = slots
				hot, hotSize = &message{from: p, m: hm}, int64(wireSize(m.POP, m.Region, m.Seq, m.Sent, slots))
			}
		}
	}
	for j := range r.top.pops {
		if j == p {
			continue
		}
		copies := 1
		if r.sc.Duplicate > 0 && r.q.rand.Float64() < r.sc.Duplicate {
			copies = 2
		}
		at := when(r.top.region[j], true)
		for range copies {
			r.messages++
			r.bytes += size
			r.q.schedule(event{at: at, kind: evDeliver, idx: j, msg: msg})
		}
		if hot == nil {
			continue
		}
		if at := direct(j); at >= 0 {
			r.messages++
			r.bytes += hotSize
			r.q.schedule(event{at: at, kind: evDeliver, idx: j, msg: hot})
		}
	}
}

// grid returns a rows × cols table of zeros.
func grid(rows, cols int) [][]int64 {
	t := make([][]int64, rows)
	for a := range t {
		t[a] = make([]int64, cols)
	}
	return t
}

// retransmit is how late a message lost on a link arrives. NATS rides TCP:
// a lost segment is sent again after at least Linux's least retransmission
// timeout, and everything behind it on the connection waits for it. The
// lab's relays lose chunks the same way (deploy/lab/faultnet).
const retransmit = int64(200 * time.Millisecond)

// linkAt returns when a message published now from region a reaches region
// b's PoPs, or -2 when it never does (a beacon, not held, on a cut link), on
// the connection whose latest delivery free[i] holds (linkFree[a][b]; or
// directFree[a][j], PoP j's own direct connection to region a).
// Region b's PoPs read one stream, fed over one connection from region a:
// messages arrive in the order they were sent, at the latency between the
// regions (plus jitter), held across a cut until it heals; on a link
// between regions a message is lost with the link's loss, and arrives a
// retransmission late with everything behind it. (A model that drops a
// lost message instead, as this one did, hid loss: the next message's
// absolute counts repaired it 10 ms later, where TCP stalls the link for
// 200 ms; the lab, which loses chunks as TCP does, measured a partition
// scenario's first window 16.9% over where the simulator said under 1%.)
func (r *run) linkAt(free []int64, i, a, b int, held bool) int64 {
	heal := r.top.healAt(a, b, r.q.now)
	if heal > r.q.now && !held {
		return -2
	}
	at := heal + r.latency(a, b)
	if loss := r.top.loss[a][b]; loss > 0 && r.q.rand.Float64() < loss {
		at += retransmit
	}
	at = max(at, free[i])
	free[i] = at
	return at
}

// latency draws a one-way latency from region a to region b.
func (r *run) latency(a, b int) int64 {
	d := r.top.base[a][b]
	if j := r.top.jitter[a][b]; j > 0 {
		d += r.q.rand.Int64N(2*j+1) - j
	}
	return max(d, 0)
}

// wireSize is the encoded size of the DeltaBatch carrying slots, as
// edgelimitpb.DeltaBatch.Add would group them (one WindowSlots per window).
// It is worked out from the lengths of the keys rather than by building the
// message and asking proto.Size: that copied every key, and reading a key's
// bytes is a cache miss, where its length sits in the slot. TestWireSize
// holds it to proto.Size.
func wireSize(replica, region string, seq uint64, sent int64, slots []crdt.Slot) int {
	n := 0
	if replica != "" {
		n += protowire.SizeTag(1) + protowire.SizeBytes(len(replica))
	}
	if region != "" {
		n += protowire.SizeTag(2) + protowire.SizeBytes(len(region))
	}
	if seq != 0 {
		n += protowire.SizeTag(3) + protowire.SizeVarint(seq)
	}
	if sent != 0 {
		n += protowire.SizeTag(4) + protowire.SizeVarint(uint64(sent))
	}
	type group struct {
		window       int64
		keys, counts int // encoded bytes of the keys, and of the packed counts' values
	}
	var buf [4]group
	groups := buf[:0]
	for i := range slots {
		s := &slots[i]
		g := len(groups) - 1
		for g >= 0 && groups[g].window != s.Window { // usually the last, as Add scans
			g--
		}
		if g < 0 {
			groups = append(groups, group{window: s.Window})
			g = len(groups) - 1
		}
		groups[g].keys += protowire.SizeTag(2) + protowire.SizeBytes(len(s.Key))
		groups[g].counts += protowire.SizeVarint(s.Count)
	}
	for _, g := range groups {
		m := g.keys + protowire.SizeTag(3) + protowire.SizeBytes(g.counts) // a group has at least one count
		if g.window != 0 {
			m += protowire.SizeTag(1) + protowire.SizeVarint(uint64(g.window))
		}
		n += protowire.SizeTag(5) + protowire.SizeBytes(m)
	}
	return n
}

// bitsSize is the encoded size of the MitigationBatch carrying bits.
func bitsSize(replica string, bits []crdt.Bit) int {
	b := &edgelimitpb.MitigationBatch{Replica: replica}
	for _, x := range bits {
		b.Bits = append(b.Bits, &edgelimitpb.MitigationBit{Key: []byte(x.Key), Scope: uint32(x.Scope), UntilUnixNano: x.Until, Origin: x.Origin})
	}
	return proto.Size(b)
}

func (r *run) result() Result {
	o := r.oracle
	tk := &o.firsts[o.tracked]
	res := Result{
		Strategy:         r.strategy.String(),
		Decisions:        o.decisions,
		Admitted:         o.admitted,
		WorstOvershoot:   o.worst,
		FalseAllows:      o.falseAllow,
		FalseDenies:      o.falseDeny,
		LegitDenies:      o.legitDeny,
		Messages:         r.messages,
		Bytes:            r.bytes,
		TrueCrossing:     -1,
		FirstDenial:      -1,
		DenialLags:       quantiles(o.lags),
		MitigationDelay:  quantiles(r.bitDelays),
		Convergence:      quantiles(r.convergence),
		Unconverged:      r.unconverged,
		ReducedDecisions: r.reduced,
		Rejected:         r.rejected,
		Series:           o.series,
		Overshoot:        o.hist,
	}
	if o.fixedWindows > 0 {
		res.MeanWindowExcess = float64(o.fixedExcess) / float64(o.fixedWindows)
	}
	if tk.crossing >= 0 {
		res.TrueCrossing = time.Duration(tk.crossing)
	}
	if tk.firstDeny >= 0 {
		res.FirstDenial = time.Duration(tk.firstDeny)
	}
	if o.decisions > 0 {
		res.AddedLatency = time.Duration(r.latencyNs / o.decisions)
		res.AddedLatencyP99 = r.latencyQuantile(0.99)
	}
	for _, s := range r.strongs {
		if s != nil {
			res.HomeUnreachable += int64(s.Stats().Unreachable)
		}
	}
	return res
}

// alias picks one of n items in proportion to its weight in O(1): Vose's
// alias method. Each entry packs what a pick reads, so that a pick from a
// large table costs one cache miss, not three. The zero value is not usable;
// use newAlias.
type alias struct {
	tab   []aliasEntry
	total float64
}

type aliasEntry struct {
	prob      float64
	item, alt int32 // the entry's own item, and the item it hands over to
}

// newAlias returns an alias table choosing items[i] with probability
// weights[i] / Σ weights. Weights must be positive.
func newAlias(weights []float64, items []int) *alias {
	n := len(weights)
	a := &alias{tab: make([]aliasEntry, n)}
	for _, w := range weights {
		a.total += w
	}
	scaled := make([]float64, n)
	var small, large []int32
	for i, w := range weights {
		a.tab[i] = aliasEntry{prob: 1, item: int32(items[i]), alt: int32(items[i])}
		scaled[i] = w * float64(n) / a.total
		if scaled[i] < 1 {
			small = append(small, int32(i))
		} else {
			large = append(large, int32(i))
		}
	}
	for len(small) > 0 && len(large) > 0 {
		s, l := small[len(small)-1], large[len(large)-1]
		small = small[:len(small)-1]
		a.tab[s].prob, a.tab[s].alt = scaled[s], int32(items[l])
		scaled[l] -= 1 - scaled[s]
		if scaled[l] < 1 {
			large = large[:len(large)-1]
			small = append(small, l)
		}
	}
	// What is left keeps probability 1 (its share is 1 up to rounding).
	return a
}

// pick draws an item.
func (a *alias) pick(rnd *rand.Rand) int {
	e := &a.tab[rnd.IntN(len(a.tab))]
	if rnd.Float64() < e.prob {
		return int(e.item)
	}
	return int(e.alt)
}
