package store

import (
	"slices"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/edgelimit/edgelimit/crdt"
	"github.com/edgelimit/edgelimit/pop/limit"
	"github.com/edgelimit/edgelimit/pop/rules"
	"github.com/edgelimit/edgelimit/region/estimate"
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
	mu          sync.Mutex
	self        string
	extrapolate bool // see MemoryConfig.Extrapolate
	inRegion    func(replica string) bool
	units       map[int64]*unitCounts // by window length
	clocks      []*estimate.Clock     // one per other replica of the topology or heard from; few, so a slice beats a map
	started     bool                  // see start
	// settled holds, when keepSettled, the windows settle judged since
	// they were last taken (takeSettled), for MemoryConfig.SettledExcess.
	settled     []settledWindow
	keepSettled bool
	// esc decides the items with consistency bounded (bounded.go); nil
	// when the replica names do not make a ledger: those items then have
	// no room.
	esc *bounded
}

// stateOf is the State a replicated item decides on at now: the ledger's
// room for a bounded item, else own and remote counts with the estimate,
// less than half a hit taken as none (estimate.Counted).
// Requires r.mu held.
func (r *replicated) stateOf(it *limit.Item, now int64) limit.State {
	if !isBounded(it) {
		st := r.state(it, now)
		st.Unheard = estimate.Counted(st.Unheard) // less than half a hit is none
		return st
	}
	if r.esc == nil {
		return limit.State{Start: limit.WindowStart(now, it.Spec.Window), Unheard: float64(it.Spec.Limit)}
	}
	return r.esc.state(it, now)
}

// counted records the outcome of a replicated item's decision: admitted
// hits in its counts, a denial at its limit (of a shadow item too when
// shadowAtLimit). It reports whether the hits were counted as admitted.
// Requires r.mu held.
func (r *replicated) counted(it *limit.Item, st *limit.State, now, hits int64, admitted, allowed, shadowAtLimit bool) bool {
	if isBounded(it) {
		if r.esc == nil {
			return false
		}
		return r.esc.settle(it, now, hits, admitted && allowed)
	}
	switch {
	case admitted && allowed:
		r.add(it, st, now, hits)
		return true
	case !allowed && (shadowAtLimit || !it.Shadow):
		r.atLimit(it, st.Start)
	}
	return false
}

// settledWindow is a window settle judged: the limit's scope and how far
// over its limit the window settled, in percent of it.
type settledWindow struct {
	scope limit.Scope
	pct   float64
}

// maxSettled bounds the judged windows kept between two takes: a PoP whose
// news stopped coming (no apply takes them) must not pile them up.
const maxSettled = 1024

// takeSettled returns the windows judged since the last call. Requires r.mu
// held.
func (r *replicated) takeSettled() []settledWindow {
	out := r.settled
	r.settled = nil
	return out
}

// clock returns the clock of the named replica, or nil. Requires r.mu held.
func (r *replicated) clock(name string) *estimate.Clock { return estimate.Lookup(r.clocks, name) }

// clockOf returns the clock of the named replica, creating it. Requires
// r.mu held.
func (r *replicated) clockOf(name string) *estimate.Clock {
	c := r.clock(name)
	if c == nil {
		c = estimate.NewClock(strings.Clone(name))
		r.clocks = append(r.clocks, c)
	}
	return c
}

type unitCounts struct {
	own    *crdt.Local
	remote crdt.Counters
	recent map[string]*estimate.Recent // own latest admissions of keys near their limit
}

func newReplicated(self string, regionPeers, replicas []string, extrapolate bool) *replicated {
	r := &replicated{self: self, inRegion: crdt.OneOf(regionPeers...), units: make(map[int64]*unitCounts),
		extrapolate: extrapolate}
	for _, name := range replicas {
		if name != self {
			r.clockOf(name) // not heard yet: held, from the first check on (see start)
		}
	}
	return r
}

// start notes, at the store's first check or apply, when the replicas it
// has not heard from began to be silent: now. Requires r.mu held.
func (r *replicated) start(now int64) {
	r.started = true
	for _, c := range r.clocks {
		c.Start(now)
	}
}

// unit returns the counters of window length w, creating them. Requires r.mu held.
func (r *replicated) unit(w int64) *unitCounts {
	u := r.units[w]
	if u == nil {
		u = &unitCounts{own: crdt.NewLocal(r.self), recent: make(map[string]*estimate.Recent)}
		r.units[w] = u
	}
	return u
}

// state is the limit.State a check of item decides on at now: own plus remote
// counts of the current and previous window. Requires r.mu held.
func (r *replicated) state(it *limit.Item, now int64) limit.State {
	if !r.started {
		r.start(now)
	}
	w := it.Spec.Window
	u := r.unit(w)
	start := limit.WindowStart(now, w)
	// A lookup does not retain its key, so the key's bytes may be borrowed.
	key := unsafe.String(unsafe.SliceData(it.Key), len(it.Key))
	in := r.inRegion
	if it.Scope == limit.ScopeGlobal {
		in = nil // every other replica
	}
	// Hash the key once for each table: a check reads three windows.
	ho, hr := u.own.Key(key), u.remote.Key(key)
	count := func(window int64) int64 {
		return int64(u.own.CountOf(ho, window) + u.remote.TotalOf(hr, window, in))
	}
	st := limit.State{Start: start, Cur: count(start), Prev: count(start - w)}
	if it.Shrunk && st.Prev > it.Spec.Limit {
		st.Prev = it.Spec.Limit // see limit.Item.Shrunk
	}
	if r.extrapolate {
		// A replica whose clock is ahead already counts in the next
		// window what happens now: its hits there are this window's too.
		// So do this PoP's own after its clock stepped back across a
		// window boundary (moveClock): they were admitted moments ago.
		st.Cur += int64(u.remote.TotalOf(hr, start+w, in) + u.own.CountOf(ho, start+w))
		// Far from the limit — under an eighth of it heard — a guess at
		// the hits not heard yet changes no decision worth its cost: it
		// would take the others admitting seven times what was heard in
		// one age of their news.
		if 8*(float64(st.Prev)*estimate.PrevWeight(now, start, w)+float64(st.Cur)+1) > float64(it.Spec.Limit) {
			st.Unheard = r.unheard(u, key, ho, hr, start, w, now, in)
			if rh := u.nearOf(key); rh != nil && settles(it) {
				st.Unheard = max(st.Unheard+r.settle(u, rh, ho, hr, it.Spec.Limit, start, w, now, in), 0)
			}
		}
	}
	return st
}

// unheard is estimate.Unheard of key, hashed ho and hr in u's tables, at
// now in the window of length w that starts at start, from the counts of
// the replicas in (nil: every replica). Requires r.mu held.
func (r *replicated) unheard(u *unitCounts, key string, ho, hr crdt.KeyHash, start, w, now int64, in func(string) bool) float64 {
	var buf [16]estimate.Count
	reps := buf[:0]
	find := func(name string) *estimate.Count {
		for i := range reps {
			if reps[i].Name == name {
				return &reps[i]
			}
		}
		reps = append(reps, estimate.Count{Name: name})
		return &reps[len(reps)-1]
	}
	u.remote.EachOf(hr, start, in, func(name string, n uint64) { find(name).Cur = n })
	u.remote.EachOf(hr, start-w, in, func(name string, n uint64) { find(name).Prev = n })
	k := estimate.Key{Now: now, Start: start, Window: w, Recent: u.nearOf(key)}
	if k.Recent != nil {
		k.Own, k.OwnPrev = u.own.CountOf(ho, start), u.own.CountOf(ho, start-w)
	}
	return estimate.Unheard(k, reps, r.clocks, in)
}

// settle returns the correction of the guess of a key near its limit
// (estimate.Recent.Judge), judging the previous window's settled count once
// per window when it is due (estimate.Recent.Due). A window judged at the
// limit is kept for SettledExcess. Requires r.mu held.
func (r *replicated) settle(u *unitCounts, rh *estimate.Recent, ho, hr crdt.KeyHash, lim, start, w, now int64, in func(string) bool) float64 {
	if !rh.Due(start, w, now, r.clocks, in) {
		return rh.Correction()
	}
	prev := start - w
	settled, atLimit := rh.Judge(start, w, lim, u.own.CountOf(ho, prev), u.remote.TotalOf(hr, prev, in))
	if atLimit && r.keepSettled && len(r.settled) < maxSettled {
		l := float64(lim)
		sc := limit.ScopeGlobal
		if in != nil {
			sc = limit.ScopeRegion
		}
		r.settled = append(r.settled, settledWindow{sc, 100 * (settled - l) / l})
	}
	return rh.Correction()
}

// settles reports whether settle steers the guess of item: a sliding window
// (see the settle constants of region/estimate for why not a fixed one).
func settles(it *limit.Item) bool { return it.Spec.Algorithm == limit.SlidingWindow }

// atLimit notes that this PoP found item's key at its limit in the window
// that starts at start — a check denied it — when it keeps recent hits of
// the key near its limit and settle steers the item. Both stores call it
// on a denial: the embedded store's decides on its estimate, the Redis
// store's on what Redis holds, which for a PoP of several servers is more
// than a server's estimate counts. Requires r.mu held.
func (r *replicated) atLimit(it *limit.Item, start int64) {
	if !r.extrapolate || !settles(it) {
		return
	}
	if u := r.units[it.Spec.Window]; u != nil {
		if rh := u.nearOf(unsafe.String(unsafe.SliceData(it.Key), len(it.Key))); rh != nil {
			rh.Reached(start)
		}
	}
}

// popCount notes the PoP's own count n of a key in the window that starts
// at window (of length w), as a store of several servers read it
// (estimate.Recent.PopCount). Requires r.mu held.
func (r *replicated) popCount(w int64, key string, window int64, n uint64) {
	u := r.units[w]
	if u == nil {
		return
	}
	if rh := u.recent[key]; rh != nil {
		rh.PopCount(window, w, n)
	}
}

// Beacon tells the store that a presence beacon of PoP pop arrived now
// (replication.BeaconCounts): see estimate.Clock.Beaconed.
func (s *Memory) Beacon(pop string) {
	s.BeaconAt(time.Now().UnixNano()+s.clock.Load(), pop)
}

// BeaconAt is Beacon at now (unix ns).
func (s *Memory) BeaconAt(now int64, pop string) {
	if s.rep != nil {
		s.rep.beaconAt(now, pop)
	}
}

// beaconAt notes a beacon of pop at now. Requires r.mu not held.
func (r *replicated) beaconAt(now int64, pop string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if pop == r.self {
		return
	}
	r.clockOf(pop).Beaconed(now)
}

// add counts hits of item in the window st starts. Requires r.mu held.
func (r *replicated) add(it *limit.Item, st *limit.State, now, hits int64) {
	u := r.unit(it.Spec.Window)
	u.own.AddBytes(it.Key, st.Start, uint64(hits))
	if !r.extrapolate {
		return
	}
	key := unsafe.String(unsafe.SliceData(it.Key), len(it.Key))
	rh := u.recent[key]
	near := estimate.NearLimit(st.Cur, st.Prev, st.Unheard, it.Spec.Limit)
	if rh == nil {
		if !near && !estimate.RememberNew(st.Cur, st.Prev, st.Unheard, it.Spec.Limit) {
			return // far from the limit: not worth the memory
		}
		rh = estimate.NewRecent(now)
		u.recent[string(it.Key)] = rh
	}
	rh.Add(now, st.Start, hits, near)
}

// nearOf returns the recent hits of key in u when the key is near its limit
// (estimate.Recent.Near), else nil. Requires r.mu held.
func (u *unitCounts) nearOf(key string) *estimate.Recent {
	if rh := u.recent[key]; rh != nil && rh.Near() {
		return rh
	}
	return nil
}

// moveClock takes a step d of the clock the PoP decides on (the PoPs'
// clock agreement moved it), now being the new clock. The hits already
// counted keep their windows, but the times this PoP remembers shift with
// the clock: its recent admissions and when it applied each replica's news.
//
// A step forward across a window boundary also moves where hits fall: the
// own hits of a key admitted in what the new clock calls the new window
// were counted in the old one, where a sliding count weighs them as the
// previous window's and forgets them as it slides — up to a whole window
// before they are a window old (skew: a PoP 300 ms behind counted a
// sprayer's first 100 ms in the window before and let them go over the
// next second, 10% over the limit). So for each key near its limit (add
// keeps its admission times) the hits admitted since the new window began
// are counted in it too. The old window's count cannot be lowered (a
// replica never publishes less), so they count twice while it weighs:
// from twice at the step down to once at the window's end — the safe side.
// (A step back needs nothing here: state counts own hits of the next
// window as current.) The bounded ledgers take the step too
// (escrow.Ledger.Step). Requires r.mu not held.
func (r *replicated) moveClock(now, d int64) {
	if d == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for w, u := range r.units {
		start, was := limit.WindowStart(now, w), limit.WindowStart(now-d, w)
		for k, rh := range u.recent {
			if start > was {
				// Admitted since the new window began: after start−d by
				// the old clock the ring's times are on.
				moved := min(rh.Since(start-d, now-d), float64(u.own.Count(k, was)))
				if n := uint64(moved); n > 0 {
					u.own.Add(k, start, n)
				}
			}
			rh.Shift(d)
		}
	}
	for _, c := range r.clocks {
		c.Shift(d)
	}
	if r.esc != nil {
		r.esc.region.Step(now, d)
		r.esc.global.Step(now, d)
	}
}

// sweep drops, for every window length, the windows before the previous one.
func (r *replicated) sweep(now int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.esc != nil {
		r.esc.region.Prune(now)
		r.esc.global.Prune(now)
	}
	for w, u := range r.units {
		horizon := limit.WindowStart(now, w) - w
		u.own.DropBefore(horizon)
		u.remote.DropBefore(horizon)
		for k, rh := range u.recent {
			if rh.Idle(now) {
				delete(u.recent, k)
			}
		}
	}
}

// admitted signals Urgent after a hit of a replicated limit was admitted.
func (s *Memory) admitted() {
	select {
	case s.urgent <- struct{}{}:
	default:
	}
}

// Urgent returns a channel that receives (without blocking a check, so
// several admissions may make one receive) after a check admitted a hit of a
// region or global limit, or decided a bounded one, and after another PoP
// was heard short of bounded allowance this one can give
// (escrow.Ledger.Wanted): news the other PoPs need before the next flush.
// Replication publishes the delta at once, at most once per its bits
// interval (replication.UrgentNotifier). Publishing every admission within
// 10 ms rather than 100 ms measured best at world scale, for about 2% more
// bytes on the wire on the 270,000-key mix (docs/accuracy-log.md).
func (s *Memory) Urgent() <-chan struct{} { return s.urgent }

// AwaitAllowance is for a check that a bounded item denied at now, asking
// for hits: it returns a channel that is closed once deciding it again may
// admit it — gives from another PoP, or news that makes room, were applied;
// closed already when there is room now — or nil when no other PoP holds
// allowance of the key it does not need, so that waiting brings nothing. A
// caller waits on it for a bounded time (pop.Engine.UseAllowanceWait), then
// decides the check again.
func (s *Memory) AwaitAllowance(it *limit.Item, now, hits int64) <-chan struct{} {
	if !isBounded(it) || s.rep == nil {
		return nil
	}
	s.rep.mu.Lock()
	defer s.rep.mu.Unlock()
	if s.rep.esc == nil {
		return nil
	}
	return s.rep.esc.awaits(it, now, hits)
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
		st := s.rep.stateOf(&items[0], now)
		states := [1]*limit.State{&st}
		admitted := limit.Decide(now, hits, items, states[:], out)
		if s.rep.counted(&items[0], &st, now, hits, admitted, out[0].Allowed, true) || isBounded(&items[0]) {
			s.admitted() // a bounded denial's demand is news too: allowance moves to it
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
			if j := sh.get(s, h, items[i].Key, now); j >= 0 {
				sh.t.slots[j].idleAt = inUse
			}
		}
	}
	for i, h := range hashes {
		if h == 0 {
			temps = append(temps, s.rep.stateOf(&items[i], now))
			states = append(states, &temps[len(temps)-1])
			continue
		}
		t := &s.shards[h>>56].t
		if j := t.find(h); j >= 0 {
			states = append(states, &t.slots[j].st)
		} else {
			temps = append(temps, limit.State{}) // untracked: see shard.get
			states = append(states, &temps[len(temps)-1])
		}
	}
	admitted := limit.Decide(now, hits, items, states, out)
	for i, h := range hashes {
		if h == 0 {
			if s.rep.counted(&items[i], states[i], now, hits, admitted, out[i].Allowed, false) || isBounded(&items[i]) {
				s.admitted()
			}
			continue
		}
		t := &s.shards[h>>56].t
		if j := t.find(h); j >= 0 {
			t.slots[j].idleAt = items[i].Spec.IdleAt(states[i])
			if s.durable && admitted && out[i].Allowed && hits > 0 {
				s.noteChanged(int(h>>56), h)
			}
		}
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

// DeltaAt is Delta at now (unix ns, the clock checks decide on), with the
// bounded limits' counters that changed: their allowances move toward
// demand first (bounded.go). The replication core calls it each flush.
func (s *Memory) DeltaAt(now int64) []crdt.Slot {
	out := s.Delta()
	if s.rep != nil && s.rep.esc != nil {
		s.rep.mu.Lock()
		out = append(out, s.rep.esc.flush(now)...)
		s.rep.mu.Unlock()
	}
	return out
}

// OwnAt is Own at now, with every own counter of the bounded limits and a
// watermark at now (bounded.go): a snapshot.
func (s *Memory) OwnAt(now int64) []crdt.Slot {
	out := s.Own()
	if s.rep != nil && s.rep.esc != nil {
		s.rep.mu.Lock()
		out = append(out, s.rep.esc.own(now)...)
		s.rep.mu.Unlock()
	}
	return out
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

// Hot returns those of slots (this PoP's own, as Delta returns them) whose
// keys this PoP admits near their limit — the keys whose news the other
// PoPs guess at, and the only ones worth a second copy on the direct path
// between regions (replication.HotCounts). It returns nil without an
// estimate (Extrapolate off). It holds the lock checks of replicated items
// take while it looks each slot's key up.
func (s *Memory) Hot(slots []crdt.Slot) []crdt.Slot {
	if s.rep == nil {
		return nil
	}
	return s.rep.hot(slots)
}

// hot is Hot for either store: a key is near its limit while this PoP
// remembers its recent admissions (add).
func (r *replicated) hot(slots []crdt.Slot) []crdt.Slot {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []crdt.Slot
	for _, sl := range slots {
		for _, u := range r.units {
			if u.nearOf(sl.Key) != nil {
				out = append(out, sl)
				break
			}
		}
	}
	return out
}

// Restore raises own counts to slots after a restart; it never lowers one.
// Slots of other replicas, and keys whose window cannot be told, are ignored.
func (s *Memory) Restore(own []crdt.Slot) {
	if s.rep != nil && s.rep.esc != nil {
		s.rep.mu.Lock()
		own, _ = s.rep.esc.apply(own, 0) // a ledger joins its own counters as any
		s.rep.mu.Unlock()
	}
	s.route(own, func(u *unitCounts, sl []crdt.Slot) { u.own.Restore(sl...) }, true)
}

// Apply joins other replicas' slots, stamped by their sender at sent (unix
// ns, 0 when unknown), into the remote counts, as applied now. Own slots, and
// keys whose window cannot be told (not built by rules.AppendKey), are
// ignored.
func (s *Memory) Apply(sent int64, remote []crdt.Slot) {
	s.ApplyAt(time.Now().UnixNano()+s.clock.Load(), sent, remote)
}

// SetClockOffset makes Apply take the wall clock plus d as the time of
// applying: the clock the engine decides on (pop.Engine.SetClockOffset).
// It also takes the step from the offset before (MoveClock).
func (s *Memory) SetClockOffset(d time.Duration) {
	if old := s.clock.Swap(int64(d)); old != int64(d) {
		s.MoveClock(time.Now().UnixNano()+int64(d), int64(d)-old)
	}
}

// MoveClock tells the store that the clock it decides on stepped by d
// (ns), now (unix ns) being the new clock: see replicated.moveClock. A
// driver with its own clock (the simulator) calls it where SetClockOffset
// would.
func (s *Memory) MoveClock(now, d int64) {
	if s.rep != nil {
		s.rep.moveClock(now, d)
	}
}

// ApplyAt is Apply at now (unix ns): the stamp and the time of applying tell
// how old each sender's news is (see MemoryConfig.Extrapolate).
func (s *Memory) ApplyAt(now, sent int64, remote []crdt.Slot) {
	if s.rep == nil {
		return
	}
	var misses []estimateMiss
	var settled []settledWindow
	// One step under the lock: a check sees the counts and how old they
	// are together, never new counts with an old age or the reverse.
	s.rep.mu.Lock()
	if s.rep.esc != nil {
		var wanted bool
		if remote, wanted = s.rep.esc.apply(remote, sent); wanted {
			s.admitted() // a starved PoP asked for allowance this one can give: flush now
		}
	}
	if s.onMiss != nil {
		misses = s.rep.misses(remote, now, sent)
	}
	s.rep.applyLocked(now, sent, remote)
	if s.onSettled != nil {
		settled = s.rep.takeSettled()
	}
	s.rep.mu.Unlock()
	for _, m := range misses {
		s.onMiss(m.scope, m.hits)
	}
	for _, w := range settled {
		s.onSettled(w.scope, w.pct)
	}
}

// applyLocked joins remote, stamped by their sender at sent, into the
// remote counts as applied now, and notes how old each sender's news is.
// Requires r.mu held.
func (r *replicated) applyLocked(now, sent int64, remote []crdt.Slot) {
	if !r.started {
		r.start(now)
	}
	r.routeLocked(remote, func(u *unitCounts, sl []crdt.Slot) { u.remote.Join(sl...) }, false)
	last := ""
	for i := range remote {
		if name := remote[i].Replica; name != last && name != r.self {
			last = name
			r.clockOf(name).Heard(now, sent)
		}
	}
}

// estimateMiss is how far this PoP's estimate of another replica's count of
// a key was from the count the replica then reported.
type estimateMiss struct {
	scope limit.Scope
	hits  float64 // estimate − reported: > 0 overestimated
}

// misses grades the estimate against remote, slots just received, stamped
// at sent and not yet joined: for each slot of the current window of a key
// this PoP estimates closely (it admitted it lately, see add), what the PoP
// held of the replica plus its guess of what the replica admitted since, up
// to the report's stamp, against what the replica reports. Requires r.mu
// held, and the replica clocks not yet told of remote.
func (r *replicated) misses(remote []crdt.Slot, now, sent int64) []estimateMiss {
	var out []estimateMiss
	for i := range remote {
		sl := &remote[i]
		if sl.Replica == r.self {
			continue
		}
		wd, ok := rules.KeyWindow(sl.Key)
		if !ok {
			continue
		}
		w := int64(wd)
		u := r.units[w]
		if u == nil || len(u.recent) == 0 {
			continue
		}
		rh := u.nearOf(sl.Key)
		clk := r.clock(sl.Replica)
		start := limit.WindowStart(now, w)
		if rh == nil || clk == nil || sl.Window != start || sent <= clk.Sent() {
			// Not a key it estimates closely, or news no newer than what
			// it holds: a second copy (the direct path's, a duplicate)
			// or a message overtaken.
			continue
		}
		scope, _ := rules.KeyScope(sl.Key)
		ho := u.own.Key(sl.Key)
		k := estimate.Key{Now: now, Start: start, Window: w, Recent: rh, Own: u.own.CountOf(ho, start), OwnPrev: u.own.CountOf(ho, start-w)}
		cur := u.remote.Replica(sl.Key, start, sl.Replica)
		prev := u.remote.Replica(sl.Key, start-w, sl.Replica)
		if sl.Count < cur {
			continue // older news than what is held
		}
		g := clk.Guess(k, cur, prev)
		// The guess runs to now; the report, to when the replica stamped
		// it, one network delay ago. Graded against the report as it was,
		// the estimate read as overestimated by what the replica admitted
		// on the way: +9.9 hits a report on anycast, +2.6 once the second
		// copies were left out, where the part of the guess up to the
		// stamp reads +0.06. That part is taken in proportion to the time:
		// the span from the held news's stamp to the report's (both on the
		// replica's clock) over the age the guess covers.
		if a := clk.Age(now); a > 0 {
			g *= min(float64(sent-clk.Sent())/a, 1)
		}
		est := float64(cur) + g
		out = append(out, estimateMiss{scope: scope, hits: est - float64(sl.Count)})
	}
	return out
}

func (s *Memory) route(slots []crdt.Slot, f func(*unitCounts, []crdt.Slot), own bool) {
	if s.rep == nil {
		return
	}
	s.rep.mu.Lock()
	defer s.rep.mu.Unlock()
	s.rep.routeLocked(slots, f, own)
}

// routeLocked is Memory.route with r.mu held.
func (r *replicated) routeLocked(slots []crdt.Slot, f func(*unitCounts, []crdt.Slot), own bool) {
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
		if (sl.Replica == r.self) != own {
			flush(i)
			continue
		}
		w, ok := rules.KeyWindow(sl.Key)
		if !ok {
			flush(i)
			continue
		}
		if u := r.unit(int64(w)); u != run {
			flush(i)
			run, runFrom = u, i
		}
	}
	flush(len(slots))
}
