package escrow

import (
	"cmp"
	"container/heap"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
)

// This file is a small discrete-event simulation of one scope's replicas
// running Ledgers against each other: a virtual clock, an event queue with
// sequence numbers to break ties, a seeded random source, a network that
// delays, drops, duplicates, reorders and partitions messages, replicas that
// crash and restart, and an exact log of every admission to judge them by.

type evKind uint8

const (
	evRequest evKind = iota
	evFlush
	evDeliver
	evCrash
	evRestart
	evCut
)

type event struct {
	at   int64
	seq  int64
	kind evKind
	rep  int      // evFlush, evCrash, evRestart, evDeliver (receiver)
	cli  int      // evRequest
	msg  *message // evDeliver
}

type eventQueue []*event

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	return q[i].at < q[j].at || q[i].at == q[j].at && q[i].seq < q[j].seq
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(*event)) }
func (q *eventQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

type message struct {
	news  News
	items []Item
}

type simKey struct {
	name string
	spec Spec
}

type clientKind uint8

const (
	pinned  clientKind = iota // one replica
	sprayer                   // a random replica per request
	burster                   // bursts of hits at random instants, at a random replica
	mover                     // one replica at a time, moving every moveEvery
)

func (k clientKind) String() string {
	return [...]string{"pinned", "sprayer", "burster", "mover"}[k]
}

type simClient struct {
	key       int
	kind      clientKind
	every     int64 // mean time between requests
	hits      int64 // hits per request
	rep       int   // pinned, mover: the current replica
	moveEvery int64 // mover
	start     int64
	stop      int64

	nextMove          int64
	requested, denied int64 // hits
	firstDenied       int64 // hits denied in the client's first window
}

type simParams struct {
	seed      uint64
	n         int
	keys      []simKey
	clients   []simClient
	end       int64 // simulated time to run
	flush     int64 // flush interval
	delayMin  int64 // one-way delay, uniform in [delayMin, delayMax]
	delayMax  int64
	drop      float64 // probability a message is lost
	dup       float64 // probability a message is delivered twice
	skew      int64   // every replica's clock is off the true time by up to ±skew
	cuts      int     // partitions over the run
	crashes   int     // crash-restarts over the run
	fifo      bool    // links deliver in the order sent and lose nothing (a stream); messages carry deltas
	check     bool    // check the invariants after every event
	checkHeld bool    // and, with check, the fractions held
	sweep     bool    // Rebalance looks at every key held, not only the ones it keeps active
}

func (p simParams) String() string {
	return fmt.Sprintf("seed=%d n=%d end=%dms flush=%dms delay=%d–%dms drop=%.2f dup=%.2f skew=%dms cuts=%d crashes=%d keys=%v",
		p.seed, p.n, p.end/ms, p.flush/ms, p.delayMin/ms, p.delayMax/ms, p.drop, p.dup, p.skew/ms, p.cuts, p.crashes, p.keys)
}

type simRep struct {
	name   string
	l      *Ledger
	offset int64 // local clock − true clock
	up     bool
	disk   []Item // own items saved at the last flush (fifo: every delta saved)

	// fifo: the messages applied, and those that arrived while down, in
	// order — the stream a restarted replica replays
	inbox, pending []*message
}

type admission struct {
	at    int64 // true time
	key   int
	label int64 // the window start the admitting replica counted it in
	hits  int64
}

type sim struct {
	p     simParams
	rng   *rand.Rand
	now   int64
	seq   int64
	q     eventQueue
	reps  []*simRep
	names []string
	cut   []bool // replicas on the minority side of the current cut
	cutTo int64
	last  [][]int64 // fifo: the last delivery time per link

	log      []admission
	admitted map[entryKey]int64 // (key name, label) → hits
	dead     map[entryKey]uint64
	fail     error

	gives, restarts int // made over the run
}

func newSim(p simParams) *sim {
	s := &sim{
		p:        p,
		rng:      rand.New(rand.NewPCG(p.seed, p.seed^0x9e3779b97f4a7c15)),
		admitted: map[entryKey]int64{},
		dead:     map[entryKey]uint64{},
		cut:      make([]bool, p.n),
	}
	for i := range p.n {
		s.names = append(s.names, "pop"+strconv.Itoa(i))
		s.last = append(s.last, make([]int64, p.n))
	}
	for i := range p.n {
		off := int64(0)
		if p.skew > 0 {
			off = s.rng.Int64N(2*p.skew+1) - p.skew
		}
		r := &simRep{name: s.names[i], offset: off, up: true}
		r.l = s.ledger(i, -10*p.flush-sec+off)
		s.reps = append(s.reps, r)
		s.push(&event{at: s.rng.Int64N(p.flush), kind: evFlush, rep: i})
	}
	for c := range s.p.clients {
		cl := &s.p.clients[c]
		cl.nextMove = cl.start + cl.moveEvery
		s.push(&event{at: cl.start + s.rng.Int64N(max(cl.every, 1)), kind: evRequest, cli: c})
	}
	for range p.cuts {
		s.push(&event{at: s.rng.Int64N(p.end), kind: evCut})
	}
	for range p.crashes {
		s.push(&event{at: s.rng.Int64N(p.end), kind: evCrash, rep: s.rng.IntN(p.n)})
	}
	return s
}

func (s *sim) ledger(i int, inc int64) *Ledger {
	l, err := New(Config{Self: s.names[i], Replicas: s.names, Incarnation: inc})
	if err != nil {
		panic(err)
	}
	return l
}

func (s *sim) push(e *event) {
	s.seq++
	e.seq = s.seq
	heap.Push(&s.q, e)
}

func (s *sim) local(i int) int64 { return s.now + s.reps[i].offset }

func (s *sim) failf(format string, args ...any) {
	if s.fail == nil {
		s.fail = fmt.Errorf("t=%dms: "+format, append([]any{s.now / ms}, args...)...)
	}
}

// run runs the simulation to its end, or to the first broken invariant,
// which it returns.
func (s *sim) run() error {
	for s.q.Len() > 0 && s.fail == nil {
		e := heap.Pop(&s.q).(*event)
		if e.at > s.p.end {
			break
		}
		s.now = e.at
		switch e.kind {
		case evRequest:
			s.request(e)
		case evFlush:
			s.flush(e.rep)
			s.push(&event{at: s.now + s.p.flush, kind: evFlush, rep: e.rep})
		case evDeliver:
			s.deliver(e.rep, e.msg)
		case evCrash:
			s.crash(e.rep)
		case evRestart:
			s.restart(e.rep)
		case evCut:
			s.partition()
		}
		// Only gives and restarts change what a replica holds; a decision
		// does not.
		if s.p.check && s.p.checkHeld && s.fail == nil && e.kind != evRequest {
			s.checkFractions()
		}
	}
	if s.fail == nil {
		s.checkLog()
	}
	return s.fail
}

func (s *sim) request(e *event) {
	c := &s.p.clients[e.cli]
	if s.now >= c.stop {
		return
	}
	gap := c.every
	if c.kind == burster || c.kind == sprayer {
		gap = 1 + s.rng.Int64N(2*c.every)
	}
	s.push(&event{at: s.now + gap, kind: evRequest, cli: e.cli})
	rep := c.rep
	switch c.kind {
	case sprayer, burster:
		rep = s.rng.IntN(s.p.n)
	case mover:
		for s.now >= c.nextMove {
			c.rep = s.rng.IntN(s.p.n)
			c.nextMove += c.moveEvery
		}
		rep = c.rep
	}
	r := s.reps[rep]
	if !r.up {
		return
	}
	k := s.p.keys[c.key]
	at := s.local(rep)
	c.requested += c.hits
	ok, _ := r.l.Decide(at, k.name, k.spec, c.hits)
	if !ok {
		c.denied += c.hits
		if s.now < c.start+k.spec.Window {
			c.firstDenied += c.hits
		}
		return
	}
	label := windowStart(at, k.spec.Window)
	s.log = append(s.log, admission{at: s.now, key: c.key, label: label, hits: c.hits})
	ek := entryKey{k.name, label}
	s.admitted[ek] += c.hits
	if s.p.check {
		s.checkAdmission(c.key, label)
	}
}

// flush is one replica's flush: rebalance, save, publish a full snapshot of
// its own items (so that any one message that arrives carries everything up
// to its watermark), and drop old windows. With fifo it saves and publishes
// a delta instead, on links that deliver in order and lose nothing.
func (s *sim) flush(i int) {
	r := s.reps[i]
	if !r.up {
		return
	}
	at := s.local(i)
	if s.p.sweep {
		r.l.lookAtAll()
	}
	s.gives += len(r.l.Rebalance(at))
	if s.p.fifo {
		s.flushDelta(i, at)
		return
	}
	news, items := r.l.Own(at)
	r.disk = items
	r.l.Prune(at)
	for j := range s.reps {
		if j == i || s.rng.Float64() < s.p.drop {
			continue
		}
		m := &message{news: news, items: items}
		d := s.delay()
		if s.now < s.cutTo && s.cut[i] != s.cut[j] {
			if s.rng.IntN(2) == 0 {
				continue // lost in the cut
			}
			d += s.cutTo - s.now // held by the stream until the cut heals
		}
		s.push(&event{at: s.now + d, kind: evDeliver, rep: j, msg: m})
		if s.rng.Float64() < s.p.dup {
			s.push(&event{at: s.now + s.delay() + s.rng.Int64N(3*s.p.flush), kind: evDeliver, rep: j, msg: m})
		}
	}
}

// flushDelta is flush on streams: each link delivers in order, a cut holds
// messages until it heals, and a duplicate comes after the original.
func (s *sim) flushDelta(i int, at int64) {
	r := s.reps[i]
	news, items := r.l.Delta(at)
	r.disk = append(r.disk, items...)
	r.l.Prune(at)
	for j := range s.reps {
		if j == i {
			continue
		}
		m := &message{news: news, items: items}
		d := s.now + s.delay()
		if s.now < s.cutTo && s.cut[i] != s.cut[j] {
			d += s.cutTo - s.now
		}
		d = max(d, s.last[i][j])
		s.last[i][j] = d
		s.push(&event{at: d, kind: evDeliver, rep: j, msg: m})
		if s.rng.Float64() < s.p.dup {
			s.push(&event{at: d + s.rng.Int64N(3*s.p.flush), kind: evDeliver, rep: j, msg: m})
		}
	}
}

func (s *sim) delay() int64 {
	return s.p.delayMin + s.rng.Int64N(s.p.delayMax-s.p.delayMin+1)
}

func (s *sim) deliver(i int, m *message) {
	r := s.reps[i]
	if !r.up {
		if s.p.fifo {
			r.pending = append(r.pending, m)
		}
		return
	}
	if s.p.fifo {
		r.inbox = append(r.inbox, m)
	}
	if err := r.l.Apply(m.news, m.items); err != nil {
		s.failf("%s refused %s's message: %v", r.name, m.news.From, err)
	}
}

// crash stops a replica: what it admitted since its last flush is lost with
// it, and it stays down for up to two windows of the shortest key.
func (s *sim) crash(i int) {
	r := s.reps[i]
	if !r.up {
		return
	}
	r.up = false
	s.push(&event{at: s.now + 1 + s.rng.Int64N(2*s.p.keys[0].spec.Window), kind: evRestart, rep: i})
}

// restart starts a new incarnation from what the replica saved. The old
// incarnation is kept in the books as a replica of its own for the windows
// that began before the new one started: it may have admitted up to what it
// held of them.
func (s *sim) restart(i int) {
	r := s.reps[i]
	inc := s.local(i)
	for _, k := range s.p.keys {
		cur := windowStart(s.now, k.spec.Window)
		for w := cur - 2*k.spec.Window; w <= cur+2*k.spec.Window; w += k.spec.Window {
			if w < inc {
				s.dead[entryKey{k.name, w}] += r.l.Held(k.name, k.spec, w)
			}
		}
	}
	s.restarts++
	r.l = s.ledger(i, inc)
	if err := r.l.Restore(r.disk); err != nil {
		s.failf("%s restore: %v", r.name, err)
	}
	if s.p.fifo {
		// The stream replays what the replica had applied, then what
		// arrived while it was down.
		for _, m := range r.inbox {
			if err := r.l.Apply(m.news, m.items); err != nil {
				s.failf("%s replay: %v", r.name, err)
			}
		}
		r.up = true
		for _, m := range r.pending {
			s.deliver(i, m)
		}
		r.pending = nil
	}
	r.up = true
}

// partition cuts a random minority of the replicas off from the rest for
// up to three windows.
func (s *sim) partition() {
	if s.now < s.cutTo {
		return
	}
	for i := range s.cut {
		s.cut[i] = s.rng.IntN(3) == 0
	}
	s.cutTo = s.now + 1 + s.rng.Int64N(3*s.p.keys[0].spec.Window)
}

// checkFractions asserts invariant (a): for every key and every window
// around now, what the replicas hold — each by its own ledger, a crashed
// incarnation by what it held when it went down — sums to at most Scale.
func (s *sim) checkFractions() {
	for _, k := range s.p.keys {
		cur := windowStart(s.now, k.spec.Window)
		for w := cur - k.spec.Window; w <= cur+k.spec.Window; w += k.spec.Window {
			sum := s.dead[entryKey{k.name, w}]
			for _, r := range s.reps {
				sum += r.l.Held(k.name, k.spec, w)
			}
			if sum > S {
				s.failf("key %s window %d: the replicas hold %d units, more than %d", k.name, w, sum, S)
				return
			}
		}
	}
}

// checkAdmission asserts invariant (b) at the instant of an admission counted
// in label: the window's total is within the limit, and for a sliding window
// P·(1−e)+C is too (with the allowance for clock skew the package doc
// states), P as counted so far.
func (s *sim) checkAdmission(key int, label int64) {
	k := s.p.keys[key]
	c := s.admitted[entryKey{k.name, label}]
	if c > k.spec.Limit {
		s.failf("key %s window %d: %d admitted, limit %d", k.name, label, c, k.spec.Limit)
		return
	}
	if k.spec.Sliding {
		p := s.admitted[entryKey{k.name, label - k.spec.Window}]
		if lhs, rhs := s.sliding(k.spec, p, c, label, s.now); lhs > rhs {
			s.failf("key %s window %d: sliding count (%d·(1−e)+%d)·W = %d over %d", k.name, label, p, c, lhs, rhs)
		}
	}
}

// sliding returns (P·(W−elapsed) + C·W, L·W + P·skew): the sliding count at
// true time t, times W, and its bound.
func (s *sim) sliding(spec Spec, p, c, label, t int64) (lhs, rhs int64) {
	el := min(max(t-label, 0), spec.Window)
	return p*(spec.Window-el) + c*spec.Window, spec.Limit*spec.Window + p*s.p.skew
}

// checkLog asserts invariant (b) again over the whole log, with every
// previous window's final total: the sliding count at every admission
// instant, and every window's total.
func (s *sim) checkLog() {
	type lk struct {
		key   int
		label int64
	}
	running := map[lk]int64{}
	final := map[lk]int64{}
	for _, a := range s.log {
		final[lk{a.key, a.label}] += a.hits
	}
	for _, a := range s.log {
		k := s.p.keys[a.key]
		id := lk{a.key, a.label}
		running[id] += a.hits
		if f := final[id]; f > k.spec.Limit {
			s.failf("key %s window %d: %d admitted, limit %d", k.name, a.label, f, k.spec.Limit)
			return
		}
		if !k.spec.Sliding {
			continue
		}
		p := final[lk{a.key, a.label - k.spec.Window}]
		if lhs, rhs := s.sliding(k.spec, p, running[id], a.label, a.at); lhs > rhs {
			s.failf("key %s window %d at %dms: sliding count (%d·(1−e)+%d)·W = %d over %d",
				k.name, a.label, a.at/ms, p, running[id], lhs, rhs)
			return
		}
	}
}

// clientStats sums requested and denied hits per client kind.
func (s *sim) clientStats() map[clientKind][2]int64 {
	out := map[clientKind][2]int64{}
	for _, c := range s.p.clients {
		v := out[c.kind]
		v[0] += c.requested
		v[1] += c.denied
		out[c.kind] = v
	}
	return out
}

// sortedKinds returns the kinds of m in order.
func sortedKinds(m map[clientKind][2]int64) []clientKind {
	var ks []clientKind
	for k := range m {
		ks = append(ks, k)
	}
	slices.SortFunc(ks, func(a, b clientKind) int { return cmp.Compare(a, b) })
	return ks
}
