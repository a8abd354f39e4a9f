package simulate

import (
	"container/heap"
	"math/rand/v2"
)

// eventKind says what an event does when it fires.
type eventKind uint8

const (
	evArrival  eventKind = iota // a request of source idx arrives
	evFlush                     // PoP idx publishes its delta
	evSnapshot                  // PoP idx publishes its full own state (anti-entropy)
	evDeliver                   // msg reaches PoP idx
)

// event is one scheduled happening at virtual time at (ns since the run's start).
type event struct {
	at   int64
	seq  uint64 // insertion order: breaks ties between events at the same instant
	kind eventKind
	idx  int
	msg  *message
}

// eventHeap orders events by (at, seq); it implements heap.Interface.
type eventHeap []event

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].seq < h[j].seq
}
func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(event)) }
func (h *eventHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = event{}
	*h = old[:len(old)-1]
	return e
}

// queue is the simulation's clock and agenda: a virtual time that only moves
// forward when the next event is taken, and a seeded random source. The zero
// value is not usable; use newQueue. A queue is not safe for concurrent use.
type queue struct {
	now  int64
	seq  uint64
	h    eventHeap
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
	heap.Push(&q.h, e)
}

// next removes the earliest event and advances the clock to it; ok is false
// when the queue is empty.
func (q *queue) next() (e event, ok bool) {
	if len(q.h) == 0 {
		return event{}, false
	}
	e = heap.Pop(&q.h).(event)
	q.now = e.at
	return e, true
}
