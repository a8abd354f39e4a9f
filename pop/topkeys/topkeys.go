// Package topkeys keeps a PoP's most limited keys in fixed memory: a
// Space-Saving heavy-hitter sketch (Metwally, Agrawal, El Abbadi, "Efficient
// Computation of Frequent and Top-k Elements in Data Streams", 2005) of the
// keys the PoP denied. With k counters, every key denied more than N/k times
// of N denials is in the sketch, and each count is over its true value by at
// most its Err, itself at most N/k. Memory is k entries whatever the traffic,
// so a flood of distinct keys cannot grow it.
//
// It imports the standard library and Prometheus's client only.
package topkeys

import (
	"sort"
	"sync"
)

// Entry is one key of the sketch: Count denials counted for it, of which up
// to Err may belong to keys it replaced (Count − Err is a lower bound of its
// true count).
type Entry struct {
	Key   string `json:"key"`
	Count uint64 `json:"count"`
	Err   uint64 `json:"error"`
}

// Sketch is a Space-Saving summary of at most K keys. The zero value is not
// usable; New makes one. A Sketch is safe for concurrent use.
type Sketch struct {
	mu  sync.Mutex
	k   int
	idx map[string]int // key → position in heap
	h   []Entry        // a min-heap by Count; requires mu held
	n   uint64         // every count added
}

// New returns a sketch of k keys (k ≥ 1).
func New(k int) *Sketch {
	k = max(k, 1)
	return &Sketch{k: k, idx: make(map[string]int, k), h: make([]Entry, 0, k)}
}

// Add counts n denials of key. It copies key only when key enters the
// sketch; a key already in it costs a map lookup and a heap step.
func (s *Sketch) Add(key []byte, n uint64) {
	s.mu.Lock()
	s.n += n
	if i, ok := s.idx[string(key)]; ok {
		s.h[i].Count += n
		s.down(i)
		s.mu.Unlock()
		return
	}
	if len(s.h) < s.k {
		s.h = append(s.h, Entry{Key: string(key), Count: n})
		s.idx[s.h[len(s.h)-1].Key] = len(s.h) - 1
		s.up(len(s.h) - 1)
		s.mu.Unlock()
		return
	}
	// Replace the least counted key: the newcomer inherits its count as
	// its possible error.
	min := &s.h[0]
	delete(s.idx, min.Key)
	*min = Entry{Key: string(key), Count: min.Count + n, Err: min.Count}
	s.idx[min.Key] = 0
	s.down(0)
	s.mu.Unlock()
}

// Top returns up to n entries, the most counted first (ties by key).
func (s *Sketch) Top(n int) []Entry {
	s.mu.Lock()
	out := append([]Entry(nil), s.h...)
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Count != out[j].Count {
			return out[i].Count > out[j].Count
		}
		return out[i].Key < out[j].Key
	})
	if n >= 0 && len(out) > n {
		out = out[:n]
	}
	return out
}

// Total returns every count added.
func (s *Sketch) Total() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

// K returns the number of keys the sketch holds at most.
func (s *Sketch) K() int { return s.k }

// up and down restore the heap from position i; require mu held.
func (s *Sketch) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if s.h[p].Count <= s.h[i].Count {
			return
		}
		s.swap(i, p)
		i = p
	}
}

func (s *Sketch) down(i int) {
	for {
		l, small := 2*i+1, i
		if l < len(s.h) && s.h[l].Count < s.h[small].Count {
			small = l
		}
		if r := l + 1; r < len(s.h) && s.h[r].Count < s.h[small].Count {
			small = r
		}
		if small == i {
			return
		}
		s.swap(i, small)
		i = small
	}
}

func (s *Sketch) swap(i, j int) {
	s.h[i], s.h[j] = s.h[j], s.h[i]
	s.idx[s.h[i].Key] = i
	s.idx[s.h[j].Key] = j
}
