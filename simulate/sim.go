package simulate

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/edgelimit/edgelimit/crdt"
	"github.com/edgelimit/edgelimit/pop"
	"github.com/edgelimit/edgelimit/pop/rules"
	"github.com/edgelimit/edgelimit/pop/store"
	edgelimitpb "github.com/edgelimit/edgelimit/proto"
)

// Strategy is a way of enforcing one limit across PoPs.
type Strategy uint8

const (
	// Edgelimit is edgelimit as built: a global-scope limit in every PoP's
	// embedded store, CRDT deltas flushed every FlushInterval through the
	// simulated network and joined by the other PoPs, and mitigation bits:
	// a PoP that finds the key over the limit issues a bit, sent with its
	// next flush, and every PoP that holds it denies without counting until
	// the bit ends.
	Edgelimit Strategy = iota
	// AsyncSync is Edgelimit without mitigation bits: CRDT deltas only.
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
// that every strategy sees the very same arrivals whatever its network draws.
const (
	streamTraffic = 1
	streamNetwork = 2
)

const (
	simDomain = "sim"
	simKey    = "tenant"
)

// topology is a scenario's PoPs and network in index form.
type topology struct {
	pops    []string
	region  []int // region index of each PoP
	regions []string
	peers   [][]string // other PoPs of each PoP's region
	base    [][]int64  // one-way latency between regions, ns
	jitter  [][]int64
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
	t.base, t.jitter = make([][]int64, n), make([][]int64, n)
	for i := range n {
		t.base[i], t.jitter[i] = make([]int64, n), make([]int64, n)
	}
	for _, l := range sc.Latency {
		a, b := idx[l.From], idx[l.To]
		ms := func(v float64) int64 { return int64(math.Round(v * float64(time.Millisecond))) }
		t.base[a][b], t.base[b][a] = ms(l.Ms), ms(l.Ms)
		t.jitter[a][b], t.jitter[b][a] = ms(l.JitterMs), ms(l.JitterMs)
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

// message is one delta batch or snapshot on its way from PoP from.
type message struct {
	from  int
	slots []crdt.Slot
	bits  []crdt.Bit
}

// run is one strategy's simulation of a scenario.
type run struct {
	sc       *Scenario
	top      *topology
	strategy Strategy
	q        *queue     // virtual clock and network randomness
	traffic  *rand.Rand // arrivals and random spread

	engines []*pop.Engine // per PoP; all the same engine when centralized
	stores  []*store.Memory
	mits    []*pop.Mitigations // per PoP, Edgelimit only
	oracle  *oracle

	req pop.Request
	res pop.Result
	rr  []int // next PoP of each spraying source

	seq              uint64
	messages, bytes  int64
	latencyNs        int64 // Σ added decision latency (centralized)
	lastSweep        []int64
	window, duration int64
}

// Run simulates sc under every strategy and reports how each did. It fails
// only on an invalid scenario or a failing engine.
func Run(sc Scenario) (Report, error) {
	// Validate fills in defaults: on copies, so that the caller's scenario
	// is never written to.
	sc.Sources = slices.Clone(sc.Sources)
	sc.Regions = slices.Clone(sc.Regions)
	if err := sc.Validate(); err != nil {
		return Report{}, fmt.Errorf("simulate: %w", err)
	}
	spec, _, _ := sc.Limit.spec()
	top := newTopology(&sc)
	rep := Report{
		Scenario: sc.Name, Seed: sc.Seed, Duration: sc.Duration,
		Limit: spec.Limit, Unit: sc.Limit.Unit, Algorithm: sc.Limit.Algorithm,
		PoPs: len(top.pops), Regions: len(top.regions),
		FlushInterval: sc.FlushInterval,
	}
	for _, s := range sc.Sources {
		rep.OfferedPerSecond += s.Rate
	}
	for _, st := range Strategies {
		res, err := runStrategy(&sc, top, st)
		if err != nil {
			return Report{}, err
		}
		rep.Results = append(rep.Results, res)
	}
	return rep, nil
}

func runStrategy(sc *Scenario, top *topology, st Strategy) (Result, error) {
	spec, unit, _ := sc.Limit.spec()
	r := &run{
		sc: sc, top: top, strategy: st,
		q:        newQueue(sc.Seed, streamNetwork),
		traffic:  rand.New(rand.NewPCG(sc.Seed, streamTraffic)),
		oracle:   newOracle(spec.Window, spec.Limit),
		rr:       make([]int, len(sc.Sources)),
		window:   spec.Window,
		duration: int64(sc.Duration),
	}
	r.req = pop.Request{Domain: simDomain, Descriptors: []pop.Descriptor{{Entries: []rules.Entry{{Key: simKey, Value: "t1"}}}}}
	n := len(top.pops)
	newEngine := func(limit int64, scope rules.Scope, cfg store.MemoryConfig) (*pop.Engine, *store.Memory, error) {
		s := spec
		s.Limit = limit
		root := &rules.Node{}
		root.Child(simKey, "").Add(&rules.Limit{Domain: simDomain, Path: simKey, Name: simKey, Unit: unit, Spec: s, Scope: scope})
		set, err := rules.NewSet(rules.NewDomain(simDomain, "simulate", root))
		if err != nil {
			return nil, nil, fmt.Errorf("simulate: rules: %w", err)
		}
		m := store.NewMemory(cfg)
		return pop.NewEngine(m, set, nil), m, nil
	}
	r.engines, r.stores = make([]*pop.Engine, n), make([]*store.Memory, n)
	for i := range n {
		var err error
		switch st {
		case Edgelimit, AsyncSync:
			r.engines[i], r.stores[i], err = newEngine(spec.Limit, rules.ScopeGlobal,
				store.MemoryConfig{MaxKeys: 1024, Replica: top.pops[i], RegionPeers: top.peers[i]})
			if st == Edgelimit && err == nil {
				if r.mits == nil {
					r.mits = make([]*pop.Mitigations, n)
				}
				r.mits[i] = pop.NewMitigations(top.pops[i])
				r.engines[i].UseMitigations(r.mits[i])
			}
		case LocalOnly:
			r.engines[i], r.stores[i], err = newEngine(spec.Limit, rules.ScopePOP, store.MemoryConfig{MaxKeys: 1024})
		case StaticSplit:
			share := spec.Limit / int64(n)
			if int64(i) < spec.Limit%int64(n) {
				share++
			}
			if share == 0 {
				return Result{}, fmt.Errorf("simulate: static split: limit %d is below the number of PoPs %d", spec.Limit, n)
			}
			r.engines[i], r.stores[i], err = newEngine(share, rules.ScopePOP, store.MemoryConfig{MaxKeys: 1024})
		case Centralized:
			if i == 0 {
				r.engines[i], r.stores[i], err = newEngine(spec.Limit, rules.ScopePOP, store.MemoryConfig{MaxKeys: 1024})
			} else {
				r.engines[i], r.stores[i] = r.engines[0], r.stores[0]
			}
		}
		if err != nil {
			return Result{}, err
		}
	}

	for i := range sc.Sources {
		r.scheduleArrival(i, int64(sc.Sources[i].Start))
	}
	if st == Edgelimit || st == AsyncSync {
		r.lastSweep = make([]int64, n)
		for i := range n {
			r.q.schedule(event{at: r.q.rand.Int64N(int64(sc.FlushInterval)), kind: evFlush, idx: i})
			r.q.schedule(event{at: r.q.rand.Int64N(int64(sc.SnapshotInterval)), kind: evSnapshot, idx: i})
		}
	}
	ctx := context.Background()
	for {
		e, ok := r.q.next()
		if !ok || e.at >= r.duration {
			break
		}
		switch e.kind {
		case evArrival:
			if err := r.arrive(ctx, e.idx); err != nil {
				return Result{}, err
			}
		case evFlush:
			var bits []crdt.Bit
			if r.mits != nil {
				bits = r.mits[e.idx].BitsDelta()
			}
			r.publish(e.idx, r.stores[e.idx].Delta(), bits)
			if now := r.q.now; now-r.lastSweep[e.idx] >= r.window {
				r.stores[e.idx].SweepAt(Epoch.UnixNano() + now)
				r.lastSweep[e.idx] = now
			}
			r.q.schedule(event{at: r.q.now + int64(sc.FlushInterval), kind: evFlush, idx: e.idx})
		case evSnapshot:
			r.publish(e.idx, r.stores[e.idx].Own(), nil)
			r.q.schedule(event{at: r.q.now + int64(sc.SnapshotInterval), kind: evSnapshot, idx: e.idx})
		case evDeliver:
			r.stores[e.idx].Apply(e.msg.slots)
			if len(e.msg.bits) > 0 {
				r.mits[e.idx].ApplyBits(e.msg.bits)
			}
		}
	}
	r.oracle.finish(r.duration)
	return r.result(), nil
}

// scheduleArrival schedules source i's next request, a Poisson arrival after
// from, unless it falls past the source's end.
func (r *run) scheduleArrival(i int, from int64) {
	s := &r.sc.Sources[i]
	at := from + int64(r.traffic.ExpFloat64()/s.Rate*float64(time.Second))
	if at < int64(s.End) {
		r.q.schedule(event{at: at, kind: evArrival, idx: i})
	}
}

// arrive decides a request of source i at the PoP its spread picks, grades
// the decision, and schedules the source's next request.
func (r *run) arrive(ctx context.Context, i int) error {
	s := &r.sc.Sources[i]
	n := len(r.top.pops)
	var p int
	switch s.Spread {
	case Anycast:
		p = i % n
		if s.PoP != "" {
			for j, name := range r.top.pops {
				if name == s.PoP {
					p = j
				}
			}
		}
	case Spray:
		p = (i + r.rr[i]) % n
		r.rr[i]++
	case Random:
		p = r.traffic.IntN(n)
	}
	now := r.q.now
	if err := r.engines[p].CheckAt(ctx, Epoch.Add(time.Duration(now)), &r.req, &r.res); err != nil {
		return fmt.Errorf("simulate: %s at %v: %w", r.strategy, time.Duration(now), err)
	}
	r.oracle.decide(now, 1, r.res.Code == pop.OK)
	if r.strategy == Centralized {
		r.latencyNs += 2 * r.top.base[r.top.region[p]][0]
	}
	r.scheduleArrival(i, now)
	return nil
}

// publish sends slots from PoP p to every other PoP, as JetStream would
// deliver them: after the latency between their regions (plus jitter), held
// across a cut link until it heals, lost with probability Loss and
// duplicated with probability Duplicate. Every copy handed to the network
// counts as a message on the wire, sized as the DeltaBatch that carries it.
func (r *run) publish(p int, slots []crdt.Slot, bits []crdt.Bit) {
	if len(slots) == 0 && len(bits) == 0 {
		return
	}
	r.seq++
	size := int64(wireSize(r.top.pops[p], r.top.regions[r.top.region[p]], r.seq, Epoch.UnixNano()+r.q.now, slots))
	if len(bits) > 0 {
		size += int64(bitsSize(r.top.pops[p], bits))
	}
	msg := &message{from: p, slots: slots, bits: bits}
	for j := range r.top.pops {
		if j == p {
			continue
		}
		copies := 1
		if r.sc.Duplicate > 0 && r.q.rand.Float64() < r.sc.Duplicate {
			copies = 2
		}
		for range copies {
			r.messages++
			r.bytes += size
			if r.sc.Loss > 0 && r.q.rand.Float64() < r.sc.Loss {
				continue
			}
			a, b := r.top.region[p], r.top.region[j]
			at := r.top.healAt(a, b, r.q.now) + r.latency(a, b)
			r.q.schedule(event{at: at, kind: evDeliver, idx: j, msg: msg})
		}
	}
}

// latency draws a one-way latency from region a to region b.
func (r *run) latency(a, b int) int64 {
	d := r.top.base[a][b]
	if j := r.top.jitter[a][b]; j > 0 {
		d += r.q.rand.Int64N(2*j+1) - j
	}
	return max(d, 0)
}

// wireSize is the encoded size of the DeltaBatch carrying slots.
func wireSize(replica, region string, seq uint64, sent int64, slots []crdt.Slot) int {
	b := &edgelimitpb.DeltaBatch{Replica: replica, Region: region, Seq: seq, SentUnixNano: sent}
	for _, s := range slots {
		b.Add([]byte(s.Key), s.Window, s.Count)
	}
	return proto.Size(b)
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
	res := Result{
		Strategy:       r.strategy.String(),
		Decisions:      o.decisions,
		Admitted:       o.admitted,
		WorstOvershoot: o.worst,
		FalseAllows:    o.falseAllow,
		FalseDenies:    o.falseDeny,
		Messages:       r.messages,
		Bytes:          r.bytes,
		TrueCrossing:   -1,
		FirstDenial:    -1,
	}
	if o.fixedWindows > 0 {
		res.MeanWindowExcess = float64(o.fixedExcess) / float64(o.fixedWindows)
	}
	if o.crossing >= 0 {
		res.TrueCrossing = time.Duration(o.crossing)
	}
	if o.firstDeny >= 0 {
		res.FirstDenial = time.Duration(o.firstDeny)
	}
	if o.decisions > 0 {
		res.AddedLatency = time.Duration(r.latencyNs / o.decisions)
	}
	return res
}
