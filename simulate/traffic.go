package simulate

import (
	"math"
	"strconv"
	"sync"
	"time"
	"unsafe"
)

// arrival is one request: when it arrives (virtual ns), the key it is limited
// on and the PoP it reaches.
type arrival struct {
	at       int64
	key, pop int32
}

const (
	// chunkArrivals is how many arrivals a traffic chunk holds (1 MiB).
	chunkArrivals = 1 << 16
	// aheadChunks is how far the fastest strategy may read ahead of the
	// slowest: it bounds the arrivals held in memory at aheadChunks+1 chunks,
	// whatever the length of the run.
	aheadChunks = 16
)

// traffic is a scenario's arrivals, drawn once and read by every strategy's
// run. Every strategy must see the very same requests; drawing them once
// instead of once per strategy also spares each run the per-request work of
// drawing (a cache miss on the source, another on the alias table, two heap
// operations), about a third of what a run that does not replicate costs
// per decision with hundreds of thousands of sources.
//
// Arrivals come in chunks, drawn on demand by whichever reader first needs
// a chunk, and dropped once every reader is past it. A reader more than
// aheadChunks ahead of the slowest waits for it, so memory stays bounded;
// the waiting reader's core goes to the slower runs, which is where the
// work is. Readers must therefore all run at once (not some after others).
//
// traffic is safe for concurrent use by its readers; each reader is one
// goroutine.
type traffic struct {
	mu     sync.Mutex
	moved  sync.Cond // a reader moved on or finished
	gen    *generator
	chunks [][]arrival // chunks[i] is chunk base+i; nil once dropped
	base   int
	read   []int // per reader: the chunk it reads; math.MaxInt once finished
	size   int   // arrivals per chunk
	peak   int   // the most chunks held at once
}

// newTraffic returns the arrivals of srcs over [0, duration) for readers
// readers, drawn from the scenario seed's traffic stream.
func newTraffic(seed uint64, srcs []source, pops int, duration int64, readers int) *traffic {
	t := &traffic{gen: newGenerator(seed, srcs, pops, duration), read: make([]int, readers), size: chunkArrivals}
	t.moved.L = &t.mu
	return t
}

// chunk returns chunk ci for reader, or nil past the last arrival. It waits
// while ci is more than aheadChunks ahead of the slowest reader still
// reading.
func (t *traffic) chunk(reader, ci int) []arrival {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.read[reader] = ci
	t.moved.Broadcast()
	for ci > t.slowest()+aheadChunks {
		t.moved.Wait()
	}
	// Drop what every reader is past.
	for t.base < t.slowest() && len(t.chunks) > 0 {
		t.chunks[0] = nil
		t.chunks = t.chunks[1:]
		t.base++
	}
	for t.base+len(t.chunks) <= ci && !t.gen.done {
		t.chunks = append(t.chunks, t.gen.next(t.size))
		t.peak = max(t.peak, len(t.chunks))
	}
	if i := ci - t.base; i < len(t.chunks) {
		return t.chunks[i]
	}
	return nil
}

// done marks reader finished, so that no other reader waits for it.
func (t *traffic) done(reader int) {
	t.mu.Lock()
	t.read[reader] = math.MaxInt
	t.moved.Broadcast()
	t.mu.Unlock()
}

// slowest returns the chunk the slowest unfinished reader reads. Requires
// t.mu held.
func (t *traffic) slowest() int {
	m := math.MaxInt
	for _, r := range t.read {
		m = min(m, r)
	}
	return m
}

// reader reads one run's arrivals in order.
type reader struct {
	t     *traffic
	id    int
	ci    int
	chunk []arrival
	pos   int
	end   bool
}

// peek returns the next arrival without taking it; ok is false past the
// last one.
func (r *reader) peek() (a *arrival, ok bool) {
	for r.pos == len(r.chunk) {
		if r.end {
			return nil, false
		}
		if r.chunk != nil {
			r.ci++
		}
		r.chunk, r.pos = r.t.chunk(r.id, r.ci), 0
		if r.chunk == nil {
			r.end = true
			r.t.done(r.id)
			return nil, false
		}
	}
	return &r.chunk[r.pos], true
}

// take moves past the arrival peek returned.
func (r *reader) take() { r.pos++ }

// ahead returns the arrival n after the next one if the current chunk holds
// it: a glimpse for prefetching, not a promise.
func (r *reader) ahead(n int) (*arrival, bool) {
	if i := r.pos + n; i < len(r.chunk) {
		return &r.chunk[i], true
	}
	return nil, false
}

// close lets the other readers go on without this one, whether or not it
// read everything.
func (r *reader) close() {
	if !r.end {
		r.end = true
		r.t.done(r.id)
	}
}

// generator draws arrivals in time order: each source's requests a Poisson
// process at its rate, within its start and end and its on phases, at the
// PoP its spread picks.
type generator struct {
	srcs     []source
	pops     int
	duration int64
	q        *queue  // the arrivals' clock, and their random source: the traffic stream
	route    []route // per source, what arrive needs of it
	rr       []int32 // next PoP of each spraying source
	steady   *alias  // the sources that send all run long, as one stream
	done     bool
}

// route is what placing a request needs of its source, packed apart from the
// source so that it costs no cache miss with hundreds of thousands of them.
type route struct {
	key    int32
	pop    uint16
	spread uint8 // routeAnycast, routeSpray or routeRandom
}

const (
	routeAnycast = iota
	routeSpray
	routeRandom
)

func newGenerator(seed uint64, srcs []source, pops int, duration int64) *generator {
	g := &generator{
		srcs: srcs, pops: pops, duration: duration,
		q:  newQueue(seed, streamTraffic), // its random source is the traffic stream
		rr: make([]int32, len(srcs)),
	}
	g.route = make([]route, len(srcs))
	for i := range srcs {
		r := route{key: int32(srcs[i].key), pop: uint16(srcs[i].pop)}
		switch srcs[i].spread {
		case Spray:
			r.spread = routeSpray
		case Random:
			r.spread = routeRandom
		}
		g.route[i] = r
	}
	// Sources sending all run long at a constant rate are one Poisson
	// stream of their summed rate whose arrivals pick a source in proportion
	// to its rate: the same process as one stream per source, exactly, but
	// with one event in the queue for all of them instead of one each (a
	// mix has hundreds of thousands).
	var rates []float64
	var idx []int
	for i := range srcs {
		if s := &srcs[i]; s.start == 0 && s.end >= duration && s.on == 0 && !s.ramps() {
			rates, idx = append(rates, s.rate), append(idx, i)
			continue
		}
		g.scheduleArrival(i, srcs[i].start)
	}
	if len(idx) > 0 {
		g.steady = newAlias(rates, idx)
		g.scheduleSteady()
	}
	return g
}

// next draws up to n more arrivals; fewer, and done set, at the end.
func (g *generator) next(n int) []arrival {
	out := make([]arrival, 0, n)
	for len(out) < n {
		e, ok := g.q.next()
		if !ok || e.at >= g.duration {
			g.done = true
			break
		}
		switch e.kind {
		case evArrival:
			out = append(out, g.arrive(e.idx))
			g.scheduleArrival(e.idx, g.q.now)
		case evSteady:
			out = append(out, g.arrive(g.steady.pick(g.q.rand)))
			g.scheduleSteady()
		}
	}
	return out
}

// arrive places a request of source i at the PoP its spread picks.
func (g *generator) arrive(i int) arrival {
	s := g.route[i]
	var p int
	switch s.spread {
	case routeAnycast:
		p = int(s.pop)
	case routeSpray:
		p = (i + int(g.rr[i])) % g.pops
		g.rr[i] = int32((int(g.rr[i]) + 1) % g.pops)
	case routeRandom:
		p = g.q.rand.IntN(g.pops)
	}
	return arrival{at: g.q.now, key: int32(s.key), pop: int32(p)}
}

// scheduleSteady schedules the next arrival of the steady sources' stream.
func (g *generator) scheduleSteady() {
	at := g.q.now + int64(g.q.rand.ExpFloat64()/g.steady.total*float64(time.Second))
	if at < g.duration {
		g.q.schedule(event{at: at, kind: evSteady})
	}
}

// scheduleArrival schedules source i's next request, a Poisson arrival after
// from, unless it falls past the source's end. An arrival drawn inside an
// off phase moves to the next on phase and is drawn again from there (the
// exponential has no memory).
func (g *generator) scheduleArrival(i int, from int64) {
	s := &g.srcs[i]
	for {
		var at int64
		if s.ramps() {
			at = s.rampArrival(from, g.q.rand.ExpFloat64())
		} else {
			at = from + int64(g.q.rand.ExpFloat64()/s.rate*float64(time.Second))
		}
		if at >= s.end {
			return
		}
		if s.on > 0 {
			period := s.on + s.off
			if ph := (at - s.start) % period; ph >= s.on {
				from = at - ph + period
				continue
			}
		}
		g.q.schedule(event{at: at, kind: evArrival, idx: i})
		return
	}
}

// ramps reports whether s's rate ramps from rate to rateEnd.
func (s *source) ramps() bool { return s.rateEnd > 0 && s.rateEnd != s.rate }

// rampArrival returns the arrival after from of a ramping source, given e,
// an exponential draw of mean 1: the instant at which the requests expected
// since from, the integral of the rate r(t) = rate + k·(t − start), reach e
// (inverting the integral is the exact non-homogeneous Poisson process).
// With r0 = r(from), r0·u + k·u²/2 = e gives u = 2e / (r0 + √(r0² + 2ke)),
// the root that stays accurate when k is near 0. It returns end or later
// when the falling rate runs out before e.
func (s *source) rampArrival(from int64, e float64) int64 {
	span := float64(s.end-s.start) / float64(time.Second)
	k := (s.rateEnd - s.rate) / span // per second per second
	r0 := s.rate + k*float64(from-s.start)/float64(time.Second)
	d := r0*r0 + 2*k*e
	if r0 <= 0 || d < 0 {
		return s.end
	}
	u := 2 * e / (r0 + math.Sqrt(d))
	if u*float64(time.Second) >= float64(s.end-from) {
		return s.end
	}
	return from + int64(u*float64(time.Second))
}

// keyNames names a run's keys: the scenario's own by table, a mix's
// generated ones ("m" and the source's number) by formatting, which spares
// a decision two cache misses (the string and its bytes) with hundreds of
// thousands of keys.
type keyNames struct {
	named []string // keys of the scenario's sources
	buf   []byte
}

// mixKey is the name of mix source i's key.
func mixKey(i int) string { return "m" + strconv.Itoa(i) }

// name returns key k's name. A name of a mix key is only valid until the
// next call: it is for a request value the engine copies.
func (n *keyNames) name(k int) string {
	if k < len(n.named) {
		return n.named[k]
	}
	n.buf = strconv.AppendInt(append(n.buf[:0], 'm'), int64(k-len(n.named)), 10)
	return unsafeString(n.buf)
}

// unsafeString views b as a string without copying; b must not change while
// the string is in use.
func unsafeString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }
