package limit

// Ring is SlidingLog's record of admitted hit times, oldest first, in a fixed
// buffer of one slot per allowed hit. It is allocated on a key's first hit and
// never again while the limit stays the same.
type Ring struct {
	buf  []int64
	head int64 // index of the oldest entry
	n    int64 // entries in use
}

func newRing(capacity int64) *Ring { return &Ring{buf: make([]int64, max(capacity, 1))} }

// Len is the number of hits in the log.
func (r *Ring) Len() int64 { return r.n }

// at returns the i-th oldest entry; requires 0 <= i < r.n.
func (r *Ring) at(i int64) int64 { return r.buf[(r.head+i)%int64(len(r.buf))] }

func (r *Ring) newest() int64 { return r.at(r.n - 1) }

// expire drops entries at or before cutoff.
func (r *Ring) expire(cutoff int64) {
	for r.n > 0 && r.buf[r.head] <= cutoff {
		r.head = (r.head + 1) % int64(len(r.buf))
		r.n--
	}
}

// push appends hits entries at t, growing the buffer when a rule reload raised
// the limit to capacity.
func (r *Ring) push(t, hits, capacity int64) {
	if r.n+hits > int64(len(r.buf)) {
		grown := make([]int64, max(capacity, r.n+hits))
		for i := int64(0); i < r.n; i++ {
			grown[i] = r.at(i)
		}
		r.buf, r.head = grown, 0
	}
	for ; hits > 0; hits-- {
		r.buf[(r.head+r.n)%int64(len(r.buf))] = t
		r.n++
	}
}
