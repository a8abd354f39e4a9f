package store

import (
	"slices"
	"sync"
	"unsafe"

	"github.com/edgelimit/edgelimit/crdt"
	"github.com/edgelimit/edgelimit/pop/limit"
	"github.com/edgelimit/edgelimit/pop/rules"
)

// replicated is the part of a Memory store that counts across PoPs: the
// per-window G-counters of limits with scope region or global. This PoP's own
// counts are a crdt.Local (what it publishes), other replicas' a
// crdt.Counters (what it applies). A check of such a limit decides on
// own + remote counts of the current and previous window, and adds admitted
// hits to its own count only.
//
// Windows of different lengths age differently, so each window length has
// its own pair, and sweep drops each pair's windows older than the previous
// one.
type replicated struct {
	mu       sync.Mutex
	self     string
	inRegion func(replica string) bool
	units    map[int64]*unitCounts // by window length
}

type unitCounts struct {
	own    *crdt.Local
	remote crdt.Counters
}

func newReplicated(self string, regionPeers []string) *replicated {
	return &replicated{self: self, inRegion: crdt.OneOf(regionPeers...), units: make(map[int64]*unitCounts)}
}

// unit returns the counters of window length w, creating them. Requires r.mu held.
func (r *replicated) unit(w int64) *unitCounts {
	u := r.units[w]
	if u == nil {
		u = &unitCounts{own: crdt.NewLocal(r.self)}
		r.units[w] = u
	}
	return u
}

// state is the limit.State a check of item decides on at now: own plus remote
// counts of the current and previous window. Requires r.mu held.
func (r *replicated) state(it *limit.Item, now int64) limit.State {
	w := it.Spec.Window
	u := r.unit(w)
	start := limit.WindowStart(now, w)
	// A lookup does not retain its key, so the key's bytes may be borrowed.
	key := unsafe.String(unsafe.SliceData(it.Key), len(it.Key))
	in := r.inRegion
	if it.Scope == limit.ScopeGlobal {
		in = nil // every other replica
	}
	count := func(window int64) int64 {
		return int64(u.own.Count(key, window) + u.remote.Total(key, window, in))
	}
	return limit.State{Start: start, Cur: count(start), Prev: count(start - w)}
}

// add counts hits of item in the window st starts. Requires r.mu held.
func (r *replicated) add(it *limit.Item, st *limit.State, hits int64) {
	r.unit(it.Spec.Window).own.AddBytes(it.Key, st.Start, uint64(hits))
}

// sweep drops, for every window length, the windows before the previous one.
func (r *replicated) sweep(now int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for w, u := range r.units {
		horizon := limit.WindowStart(now, w) - w
		u.own.DropBefore(horizon)
		u.remote.DropBefore(horizon)
	}
}

// replicates reports whether s counts it across PoPs.
func (s *Memory) replicates(it *limit.Item) bool {
	return s.rep != nil && it.Scope != limit.ScopePOP && it.Spec.Algorithm.Replicable()
}

// checkMany is CheckAt for several items, or a replicated one: it locks the
// shards of the table items in order (and the replicated counts when an item
// replicates), so that the whole check is one atomic step.
func (s *Memory) checkMany(now, hits int64, items []limit.Item, out []limit.Decision) {
	if len(items) == 1 && s.replicates(&items[0]) { // no shard, and no state on the heap
		s.rep.mu.Lock()
		st := s.rep.state(&items[0], now)
		states := [1]*limit.State{&st}
		if limit.Decide(now, hits, items, states[:], out) && out[0].Allowed {
			s.rep.add(&items[0], &st, hits)
		}
		s.rep.mu.Unlock()
		return
	}
	var (
		hashBuf  [maxInline]uint64
		orderBuf [maxInline]int
		stateBuf [maxInline]*limit.State
		tempBuf  [maxInline]limit.State
	)
	hashes, order, states := hashBuf[:0], orderBuf[:0], stateBuf[:0]
	temps := tempBuf[:0]
	if len(items) > maxInline {
		temps = make([]limit.State, 0, len(items)) // pointers into temps must not move
	}
	replicated := false
	for i := range items {
		if s.replicates(&items[i]) {
			hashes = append(hashes, 0) // 0: counted in s.rep, not in a shard
			replicated = true
			continue
		}
		h := s.hash(items[i].Key)
		hashes = append(hashes, h)
		order = append(order, int(h>>56))
	}
	order = sortedUnique(order)
	for _, si := range order {
		s.shards[si].mu.Lock()
	}
	if replicated {
		s.rep.mu.Lock()
	}
	// Find or make every slot first, marked in use; then take pointers, which
	// no later insert in the same shard can move.
	for i, h := range hashes {
		if h != 0 {
			sh := &s.shards[h>>56]
			sh.t.slots[sh.get(s, h, items[i].Key, now)].idleAt = inUse
		}
	}
	for i, h := range hashes {
		if h == 0 {
			temps = append(temps, s.rep.state(&items[i], now))
			states = append(states, &temps[len(temps)-1])
			continue
		}
		t := &s.shards[h>>56].t
		states = append(states, &t.slots[t.find(h)].st)
	}
	admitted := limit.Decide(now, hits, items, states, out)
	for i, h := range hashes {
		if h == 0 {
			if admitted && out[i].Allowed {
				s.rep.add(&items[i], states[i], hits)
			}
			continue
		}
		t := &s.shards[h>>56].t
		t.slots[t.find(h)].idleAt = items[i].Spec.IdleAt(states[i])
	}
	if replicated {
		s.rep.mu.Unlock()
	}
	for i := len(order) - 1; i >= 0; i-- {
		s.shards[order[i]].mu.Unlock()
	}
}

// The methods below make a Memory store with a replica name a
// replication.Counts (cmd wires them; pop does not import replication).

// Delta returns this PoP's own replicated slots changed since the last call.
func (s *Memory) Delta() []crdt.Slot {
	return s.collect(func(u *unitCounts) []crdt.Slot { return u.own.Delta() })
}

// Own returns every own replicated slot.
func (s *Memory) Own() []crdt.Slot {
	return s.collect(func(u *unitCounts) []crdt.Slot { return u.own.Slots() })
}

// Remote returns every slot of other replicas.
func (s *Memory) Remote() []crdt.Slot {
	return s.collect(func(u *unitCounts) []crdt.Slot { return u.remote.Slots() })
}

func (s *Memory) collect(f func(*unitCounts) []crdt.Slot) []crdt.Slot {
	if s.rep == nil {
		return nil
	}
	s.rep.mu.Lock()
	defer s.rep.mu.Unlock()
	ws := make([]int64, 0, len(s.rep.units))
	for w := range s.rep.units {
		ws = append(ws, w)
	}
	slices.Sort(ws) // a deterministic order
	var out []crdt.Slot
	for _, w := range ws {
		out = append(out, f(s.rep.units[w])...)
	}
	return out
}

// Restore raises own counts to slots after a restart; it never lowers one.
// Slots of other replicas, and keys whose window cannot be told, are ignored.
func (s *Memory) Restore(own []crdt.Slot) {
	s.route(own, func(u *unitCounts, sl []crdt.Slot) { u.own.Restore(sl...) }, true)
}

// Apply joins other replicas' slots into the remote counts. Own slots, and
// keys whose window cannot be told (not built by rules.AppendKey), are ignored.
func (s *Memory) Apply(sent int64, remote []crdt.Slot) {
	s.route(remote, func(u *unitCounts, sl []crdt.Slot) { u.remote.Join(sl...) }, false)
}

func (s *Memory) route(slots []crdt.Slot, f func(*unitCounts, []crdt.Slot), own bool) {
	if s.rep == nil {
		return
	}
	s.rep.mu.Lock()
	defer s.rep.mu.Unlock()
	// Hand f runs of consecutive slots of one window length, not one slot
	// at a time: Counters.Join works a large batch far faster than its
	// slots one by one (it reads ahead, or sweeps its tables in order).
	var (
		run     *unitCounts
		runFrom int
	)
	flush := func(to int) {
		if run != nil && to > runFrom {
			f(run, slots[runFrom:to])
		}
		run = nil
	}
	for i := range slots {
		sl := &slots[i]
		if (sl.Replica == s.rep.self) != own {
			flush(i)
			continue
		}
		w, ok := rules.KeyWindow(sl.Key)
		if !ok {
			flush(i)
			continue
		}
		if u := s.rep.unit(int64(w)); u != run {
			flush(i)
			run, runFrom = u, i
		}
	}
	flush(len(slots))
}
