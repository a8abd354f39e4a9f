package simulate

import "math/rand/v2"

// eventKind says what an event does when it fires.
type eventKind uint8

const (
	evArrival  eventKind = iota // a request of source idx arrives
	evSteady                    // a request of one of the steady sources arrives
	evTick                      // PoP idx's replication core reaches its deadline
	evDeliver                   // msg reaches PoP idx
	evHeal                      // partition idx heals
	evConverge                  // check whether the state at heal idx reached every PoP
	evWaited                    // waiting check idx reaches the end of its wait (boundedwait.go)
)

// event is one scheduled happening at virtual time at (ns since the run's start).
type event struct {
	at   int64
	seq  uint64 // insertion order: breaks ties between events at the same instant
	kind eventKind
	arg  int32
	idx  int
	msg  *message
}

// before orders events by (at, seq).
func (e *event) before(o *event) bool {
	if e.at != o.at {
		return e.at < o.at
	}
	return e.seq < o.seq
}

// queue is the simulation's clock and agenda: a virtual time that only moves
// forward when the next event is taken, and a seeded random source. The zero
// value is not usable; use newQueue. A queue is not safe for concurrent use.
type queue struct {
	now  int64
	seq  uint64
	h    []event // a binary min-heap by (at, seq); typed, as container/heap would box every event
	rand *rand.Rand
}

// newQueue returns an empty queue at time 0 whose random source is the PCG
// stream (seed, stream).
func newQueue(seed, stream uint64) *queue {
	return &queue{rand: rand.New(rand.NewPCG(seed, stream))}
}

// schedule adds e to fire at e.at, which must not be before now.
func (q *queue) schedule(e event) {
	if e.at < q.now {
		e.at = q.now
	}
	q.seq++
	e.seq = q.seq
	q.h = append(q.h, e)
	h := q.h
	for i := len(h) - 1; i > 0; {
		parent := (i - 1) / 2
		if !h[i].before(&h[parent]) {
			break
		}
		h[i], h[parent] = h[parent], h[i]
		i = parent
	}
}

// next removes the earliest event and advances the clock to it; ok is false
// when the queue is empty.
func (q *queue) next() (e event, ok bool) {
	if len(q.h) == 0 {
		return event{}, false
	}
	h := q.h
	e = h[0]
	last := len(h) - 1
	h[0] = h[last]
	h[last] = event{} // drop the message pointer
	h = h[:last]
	for i := 0; ; {
		small, l, r := i, 2*i+1, 2*i+2
		if l < len(h) && h[l].before(&h[small]) {
			small = l
		}
		if r < len(h) && h[r].before(&h[small]) {
			small = r
		}
		if small == i {
			break
		}
		h[i], h[small] = h[small], h[i]
		i = small
	}
	q.h = h
	q.now = e.at
	return e, true
}
