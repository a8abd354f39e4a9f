package store

import (
	"cmp"
	"context"
	_ "embed" // the Lua script
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/redis/go-redis/v9"

	"github.com/edgelimit/edgelimit/crdt"
	"github.com/edgelimit/edgelimit/pop/limit"
	"github.com/edgelimit/edgelimit/pop/rules"
)

// Replication in the Redis store (RedisConfig.Replica set).
//
// The model is the embedded store's (replicated.go): limits with scope region
// or global and a window algorithm count this PoP's hits, and decide on this
// PoP's plus the other PoPs' counts of the current and previous window. A PoP
// may be several servers sharing one Redis: together they are ONE replica,
// named by RedisConfig.Replica, and its count for a (key, window) is the one
// Redis holds.
//
//   - Own counts are the ordinary window state of the key (check.lua,
//     "index cur prev"): a replicated limit counts exactly as any other.
//   - Remote counts live next to the key, in the same hash tag (so the same
//     Cluster slot): one hash per (key, window), el:{<tag>}:m:<index>:<key>,
//     holding each other replica's absolute count and two running totals,
//     global and region. Apply max-merges slots into them (scripts/merge.lua,
//     O(1) per slot); a check reads the total of its scope for the current
//     and previous window (O(1) whatever the number of PoPs). The hashes
//     expire at the end of the window after next, when they are useless.
//
// What each server knows of the PoP's replication state is only what it did
// itself: the (key, window) pairs it counted and the remote hashes it merged
// into. Delta, Own and Remote are built from that (see each), reading the
// values from Redis, so they return the PoP's absolute counts; every server
// publishes what it touched, and the duplicates are harmless under the
// per-replica maximum that every receiver joins with.
//
// Counts' methods return no error; each failure is kept (ReplicationErr)
// and, for Delta, the slots are retried by the next call. The ...Ctx forms
// return the error.
type redisReplicated struct {
	self     string
	inRegion func(replica string) bool

	mu     sync.Mutex
	own    map[trackKey]*ownTrack // (key, window start) this server counted
	remote map[trackKey]int64     // remote hashes this server merged into → window length
	err    error                  // the last replication failure, nil after a success
	pruned int64                  // when the maps were last pruned (store time, ns)
}

type trackKey struct {
	key    string
	window int64 // window start, ns
}

type ownTrack struct {
	w         int64           // window length, ns
	alg       limit.Algorithm // the key's algorithm (its Redis key names it)
	dirty     bool            // counted since the last Delta
	published uint64          // the most this server published of the pair (ownSlots)
	held      uint64          // the most this server read Redis holding of the pair, or put there (ownSlots)
	offline   uint32          // checks counted in the estimate while Redis was away, not yet restored (redis_offline.go)
}

// pruneEvery is how often, at most, checks and Apply drop tracked pairs of
// windows no longer held (Delta, Own and Remote always do), so the maps stay
// bounded by the pairs of the current and previous windows.
const pruneEvery = int64(time.Second)

// pruneLocked drops the tracked pairs older than their previous window at
// now. Requires r.mu held.
func (r *redisReplicated) pruneLocked(now int64) {
	r.pruned = now
	for tk, t := range r.own {
		if tk.window < limit.WindowStart(now, t.w)-t.w {
			delete(r.own, tk)
		}
	}
	for tk, w := range r.remote {
		if tk.window < limit.WindowStart(now, w)-w {
			delete(r.remote, tk)
		}
	}
}

// pruneDueLocked prunes when the last prune is pruneEvery old. Requires r.mu held.
func (r *redisReplicated) pruneDueLocked(now int64) {
	if now-r.pruned >= pruneEvery || now < r.pruned {
		r.pruneLocked(now)
	}
}

// replOpTimeout bounds each Delta, Own, Remote, Restore and Apply.
const replOpTimeout = 2 * time.Second

// mergeBatch is how many slots one merge.lua call carries, at most.
const mergeBatch = 128

//go:embed scripts/merge.lua
var mergeLua string

// mergeScript is merge.lua; its SHA-1 is computed once, client-side.
var mergeScript = redis.NewScript(mergeLua)

func newRedisReplicated(cfg RedisConfig) *redisReplicated {
	if cfg.Replica == "" {
		return nil
	}
	return &redisReplicated{
		self:     cfg.Replica,
		inRegion: crdt.OneOf(cfg.RegionPeers...),
		own:      make(map[trackKey]*ownTrack),
		remote:   make(map[trackKey]int64),
	}
}

// replicates reports whether s counts it across PoPs.
func (s *Redis) replicates(it *limit.Item) bool {
	return s.rep != nil && it.Scope != limit.ScopePOP && it.Spec.Algorithm.Replicable()
}

// remoteField is the hash field of the remote total a limit of scope sc adds.
func remoteField(sc limit.Scope) string {
	if sc == limit.ScopeGlobal {
		return "~g"
	}
	return "~r"
}

// appendRemoteKey appends the Redis key of key's remote hash for the window
// of index widx: el:{<tag>}:m:<widx>:<key>, in the slot of key's own state.
func appendRemoteKey(b, key []byte, widx int64) []byte {
	b = append(b, "el:{"...)
	b = appendTag(b, key)
	b = append(b, "}:m:"...)
	b = strconv.AppendInt(b, widx, 10)
	b = append(b, ':')
	return append(b, key...)
}

// now is the store's current time on the clock windows are cut by: the
// clock checks decide on (the caller's, corrected by the PoPs' clock
// agreement, SetClockOffset), shifted as CheckAt shifts it.
func (s *Redis) now() int64 {
	now := s.cfg.Clock() + s.agreed.Load()
	if s.cfg.ClockSource == ClockRedis {
		now += s.offset.Load()
	}
	return now
}

// SetClockOffset is Memory.SetClockOffset for a PoP on Redis: the engine
// now decides on the wall clock plus d (pop.Engine.SetClockOffset), and so
// the store takes that clock too as the time it applies the other PoPs'
// news and beacons — else the estimate's ages of their news would be off
// by d — and moves its estimate's clock by the step (replicated.moveClock).
func (s *Redis) SetClockOffset(d time.Duration) {
	if old := s.agreed.Swap(int64(d)); old != int64(d) && s.est != nil {
		s.est.moveClock(s.now(), int64(d)-old)
	}
}

// track records, after a successful check at now (CheckAt's now, shifted
// onto the window clock), the replicated items it admitted, for the next Delta. It
// returns err unchanged. An item admitted within a request that was denied
// as a whole counted nothing; marking it only republishes its count.
func (s *Redis) track(now int64, items []limit.Item, out []limit.Decision, err error) error {
	if err != nil || s.rep == nil {
		return err
	}
	s.markOwn(now, items, out, false)
	return nil
}

// markOwn marks for the next Delta the (key, window) pair at now of each
// replicated item that out allowed — each one when out is nil — tracking
// it first; with offline, also as counted while Redis was away
// (redis_offline.go). It reports whether it marked any. Requires s.rep.
func (s *Redis) markOwn(now int64, items []limit.Item, out []limit.Decision, offline bool) bool {
	r := s.rep
	locked := false
	for i := range items {
		it := &items[i]
		if (out != nil && !out[i].Allowed) || !s.replicates(it) {
			continue
		}
		if !locked {
			r.mu.Lock()
			r.pruneDueLocked(now)
			locked = true
		}
		w := it.Spec.Window
		// A lookup does not retain its key, so the key's bytes may be borrowed.
		tk := trackKey{unsafe.String(unsafe.SliceData(it.Key), len(it.Key)), limit.WindowStart(now, w)}
		t := r.own[tk]
		if t == nil {
			tk.key = string(it.Key)
			t = &ownTrack{w: w, alg: it.Spec.Algorithm}
			r.own[tk] = t
		}
		t.dirty = true
		if offline {
			t.offline++
		}
	}
	if locked {
		r.mu.Unlock()
	}
	return locked
}

// The methods below make a Redis store with a replica name a
// replication.Counts (cmd wires them; pop does not import replication).
// Without a replica name they do nothing and return nil.

// Delta returns the PoP's absolute counts, read from Redis, of the
// replicated (key, window) pairs this server counted since the last call
// (not those only other servers of the PoP counted: they publish them), in
// crdt.CompareSlots order. Pairs whose count could not be read are kept for
// the next call; the failure is in ReplicationErr.
func (s *Redis) Delta() []crdt.Slot {
	out, err := s.DeltaCtx(context.Background())
	s.rep.noteErr(err)
	return out
}

// DeltaCtx is Delta returning the error of a failed read with what was read.
func (s *Redis) DeltaCtx(ctx context.Context) ([]crdt.Slot, error) {
	return s.ownSlots(ctx, true)
}

// Own returns the PoP's absolute counts, read from Redis, of every
// replicated (key, window) this server counted in the windows still held
// (current and previous of each window length), in crdt.CompareSlots order:
// this server's share of a snapshot. Own does not touch what Delta returns.
func (s *Redis) Own() []crdt.Slot {
	out, err := s.OwnCtx(context.Background())
	s.rep.noteErr(err)
	return out
}

// OwnCtx is Own returning the error of a failed read with what was read.
func (s *Redis) OwnCtx(ctx context.Context) ([]crdt.Slot, error) {
	return s.ownSlots(ctx, false)
}

// ownSlots reads the own counts of the tracked pairs: the dirty ones (and
// clears their mark) for a delta, or all of them.
func (s *Redis) ownSlots(ctx context.Context, delta bool) ([]crdt.Slot, error) {
	r := s.rep
	if r == nil {
		return nil, nil
	}
	if err := s.ownerConflict(); err != nil {
		return nil, err // what Redis holds is not this PoP's count alone
	}
	type pending struct {
		tk trackKey
		t  ownTrack
	}
	now := s.now()
	var todo []pending
	r.mu.Lock()
	r.pruneLocked(now)
	for tk, t := range r.own {
		if delta && !t.dirty {
			continue
		}
		todo = append(todo, pending{tk, *t})
		t.dirty = false
	}
	r.mu.Unlock()
	if len(todo) == 0 {
		return nil, nil
	}

	// What the estimate counted of each pair, taken before Redis is read:
	// it adds this server's hits after Redis counted them, so it is never
	// above what Redis held then — unless Redis lost them, or never had
	// them (counted while Redis was away, redis_offline.go).
	floor := make([]uint64, len(todo))
	if e := s.est; e != nil {
		e.mu.Lock()
		for i, p := range todo {
			if u := e.units[p.t.w]; u != nil {
				floor[i] = u.own.Count(p.tk.key, p.tk.window)
			}
		}
		e.mu.Unlock()
	}

	ctx, cancel := context.WithTimeout(ctx, replOpTimeout)
	defer cancel()
	pipe := s.client.Pipeline()
	cmds := make([]*redis.StringCmd, len(todo))
	var kbuf []byte
	for i, p := range todo {
		it := limit.Item{Key: []byte(p.tk.key), Spec: limit.Spec{Algorithm: p.t.alg}}
		kbuf = appendRedisKey(kbuf[:0], &it)
		cmds[i] = pipe.Get(ctx, string(kbuf))
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error

	var (
		out    []crdt.Slot
		errs   []error
		failed []trackKey
		lost   []crdt.Slot // counts Redis no longer holds, or never had (see below)
		read   []crdt.Slot // what Redis holds of each pair read, once lost counts are back
		readW  []int64     // the window length of each of read
		gone   bool        // Redis holds less than it did: it lost counts
	)
	for i, p := range todo {
		v, err := cmds[i].Result()
		var n uint64
		unread := false
		switch {
		case errors.Is(err, redis.Nil):
			// Expired — or Redis lost it (restarted empty, or from an older
			// snapshot) while its window is still held: then the published
			// count below stands.
		case err != nil:
			errs = append(errs, err)
			failed = append(failed, p.tk)
			unread = true
		default:
			if n, err = ownCount(v, p.tk.window/p.t.w); err != nil {
				errs = append(errs, fmt.Errorf("key %q: %w", p.tk.key, err))
				continue
			}
		}
		if _, live := mergeTTL(p.tk.window/p.t.w, p.t.w, now); !live {
			continue // the window is no longer held
		}
		// A replica never publishes less than it did: receivers keep the
		// most they heard, so a lower count would hide this PoP's hits
		// until they passed it again, while every other PoP went on
		// admitting against the old one. Redis holds less than this server
		// published, or than its estimate counted, when it lost counts or
		// never had them: put them back, so that new hits add to them
		// (what other servers of the PoP admitted between a loss and now,
		// at most one flush interval of it, stays lost, as after a kill -9;
		// this server's own hits are in its estimate).
		least := max(p.t.published, floor[i])
		if unread {
			// Redis is away: publish what the estimate counted beyond
			// what was published (the hits admitted meanwhile), and keep
			// the pair for the next Delta, which puts them into Redis.
			if least > p.t.published {
				out = append(out, crdt.Slot{Key: p.tk.key, Window: p.tk.window, Replica: r.self, Count: least})
			}
			continue
		}
		if n < least {
			lost = append(lost, crdt.Slot{Key: p.tk.key, Window: p.tk.window, Replica: r.self, Count: least})
			gone = gone || n < p.t.held
			n = least
		}
		if n > 0 {
			out = append(out, crdt.Slot{Key: p.tk.key, Window: p.tk.window, Replica: r.self, Count: n})
			read = append(read, out[len(out)-1])
			readW = append(readW, p.t.w)
		}
	}
	if e := s.est; e != nil && len(read) > 0 {
		// The PoP's own counts, for the settled count the estimate judges
		// its guess by (replicated.settle): its own counts hold this
		// server's hits only.
		e.mu.Lock()
		for i, sl := range read {
			e.popCount(readW[i], sl.Key, sl.Window, sl.Count)
		}
		e.mu.Unlock()
	}
	r.mu.Lock()
	for _, sl := range out {
		if t := r.own[trackKey{sl.Key, sl.Window}]; t != nil {
			t.published = max(t.published, sl.Count)
		}
	}
	for _, sl := range read {
		if t := r.own[trackKey{sl.Key, sl.Window}]; t != nil {
			t.held = max(t.held, sl.Count)
		}
	}
	if delta { // retried by the next Delta
		for _, tk := range failed {
			if t := r.own[tk]; t != nil {
				t.dirty = true
			}
		}
	}
	r.mu.Unlock()
	if len(lost) > 0 {
		if err := s.restoreLost(ctx, lost, gone); err != nil {
			errs = append(errs, err)
		}
	}
	slices.SortFunc(out, crdt.CompareSlots)
	if len(errs) > 0 {
		return out, fmt.Errorf("store: redis: reading %d of %d own counts: %w", len(errs), len(todo), errors.Join(errs...))
	}
	return out, nil
}

// ownCount returns the count of window index widx in a window state
// "index cur prev", zero when the state has moved past its previous window.
func ownCount(v string, widx int64) (uint64, error) {
	f := strings.Fields(v)
	if len(f) != 3 {
		return 0, fmt.Errorf("window state %q is not \"index cur prev\"", v)
	}
	var n [3]uint64
	for i := range f {
		x, err := strconv.ParseUint(f[i], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("window state %q: %w", v, err)
		}
		n[i] = x
	}
	switch int64(n[0]) {
	case widx:
		return n[1], nil
	case widx + 1:
		return n[2], nil
	}
	return 0, nil
}

// restoreLost puts into Redis the own counts it lacks (ownSlots), and, when
// it lost counts it held (gone), the other PoPs' counts the store's
// estimate holds (the remote hashes were lost too, and would otherwise
// wait for the next snapshot): an emptied Redis must not re-grant the
// limits of region and global keys. A Redis that only lacks hits counted
// while it was away (redis_offline.go) lost nothing else, and is spared
// the merge of every remote count at each flush of an outage.
func (s *Redis) restoreLost(ctx context.Context, own []crdt.Slot, gone bool) error {
	err := s.RestoreCtx(ctx, own)
	if gone {
		s.lostRestores.Add(1)
	}
	if gone && s.est != nil {
		s.est.mu.Lock()
		var remote []crdt.Slot
		for _, u := range s.est.units {
			remote = append(remote, u.remote.Slots()...)
		}
		s.est.mu.Unlock()
		err = errors.Join(err, s.ApplyCtx(ctx, remote))
	}
	return err
}

// Restore raises the PoP's own counts in Redis to at least the given slots
// (a PoP restarting, perhaps with an emptied Redis); it never lowers one.
// Slots of other replicas, with a zero count, for windows older than the
// previous one, or whose key does not name a window algorithm and unit
// (rules.AppendKey) are ignored. Restored pairs are published by the next
// Delta, as crdt.Local.Restore does. A failure is in ReplicationErr.
func (s *Redis) Restore(own []crdt.Slot) {
	s.rep.noteErr(s.RestoreCtx(context.Background(), own))
}

// RestoreCtx is Restore returning its error.
func (s *Redis) RestoreCtx(ctx context.Context, own []crdt.Slot) error {
	r := s.rep
	if r == nil {
		return nil
	}
	now := s.now()
	var args []mergeArg
	var kbuf []byte
	var est []crdt.Slot // the live slots, for the estimate
	r.mu.Lock()
	for _, sl := range own {
		if sl.Replica != r.self || sl.Count == 0 {
			continue
		}
		w, alg, ok := slotWindow(sl.Key)
		if !ok {
			continue
		}
		widx := floorDiv(sl.Window, w)
		px, live := mergeTTL(widx, w, now)
		if !live {
			continue
		}
		est = append(est, sl)
		it := limit.Item{Key: []byte(sl.Key), Spec: limit.Spec{Algorithm: alg}}
		kbuf = appendRedisKey(kbuf[:0], &it)
		args = append(args, mergeArg{key: string(kbuf), slot: keySlot(it.Key),
			a: [4]any{widx, strconv.FormatUint(sl.Count, 10), px, ""}})
		tk := trackKey{sl.Key, widx * w}
		if t := r.own[tk]; t != nil {
			t.dirty = true
		} else {
			r.own[tk] = &ownTrack{w: w, alg: alg, dirty: true}
		}
	}
	r.mu.Unlock()
	// The estimate holds this PoP's own counts too: its Fallback decides
	// region and global limits on them while Redis is away
	// (redis_offline.go), and a restarted PoP's estimate had only the other
	// PoPs' (Apply), so it re-granted what it had admitted before the
	// restart (TestFallbackAfterRestartKnowsOwnCounts).
	if e := s.est; e != nil && len(est) > 0 {
		e.mu.Lock()
		for _, sl := range est {
			w, _, _ := slotWindow(sl.Key)
			e.unit(w).own.Restore(sl)
		}
		e.mu.Unlock()
	}
	if err := s.merge(ctx, "o", args); err != nil {
		return fmt.Errorf("store: redis: restoring %d own slots: %w", len(args), err)
	}
	return nil
}

// Apply max-merges other replicas' slots into the remote hashes in Redis
// (merge.lua, pipelined, mergeBatch slots a call). Slots of this PoP's own
// replica, with a zero count, for windows older than the previous one, or
// whose key does not name a window algorithm and unit (rules.AppendKey) are
// ignored. Duplicated, reordered and stale slots never count twice. A
// failure is in ReplicationErr (the next anti-entropy snapshot repairs it).
func (s *Redis) Apply(sent int64, remote []crdt.Slot) {
	if i := slices.IndexFunc(remote, func(sl crdt.Slot) bool { return isEscrow(&sl) }); i >= 0 {
		// Bounded limits' counters: a PoP on Redis serves none (node
		// refuses them), and their keys must not become remote hashes.
		remote = slices.DeleteFunc(slices.Clone(remote), func(sl crdt.Slot) bool { return isEscrow(&sl) })
	}
	if s.est != nil {
		s.estimateApply(s.now(), sent, remote)
	}
	s.rep.noteErr(s.ApplyCtx(context.Background(), remote))
}

// ApplyCtx is Apply returning its error.
func (s *Redis) ApplyCtx(ctx context.Context, remote []crdt.Slot) error {
	r := s.rep
	if r == nil {
		return nil
	}
	if err := s.ownerConflict(); err != nil {
		return err // the next snapshot repairs what is not merged
	}
	now := s.now()
	var args []mergeArg
	var kbuf []byte
	r.mu.Lock()
	r.pruneDueLocked(now)
	for _, sl := range remote {
		if sl.Replica == r.self || sl.Count == 0 {
			continue
		}
		w, _, ok := slotWindow(sl.Key)
		if !ok {
			continue
		}
		widx := floorDiv(sl.Window, w)
		px, live := mergeTTL(widx, w, now)
		if !live {
			continue
		}
		key := []byte(sl.Key)
		kbuf = appendRemoteKey(kbuf[:0], key, widx)
		region := 0
		if r.inRegion(sl.Replica) {
			region = 1
		}
		args = append(args, mergeArg{key: string(kbuf), slot: keySlot(key),
			a: [4]any{sl.Replica, strconv.FormatUint(sl.Count, 10), region, px}})
		r.remote[trackKey{sl.Key, widx * w}] = w
	}
	r.mu.Unlock()
	if err := s.merge(ctx, "r", args); err != nil {
		return fmt.Errorf("store: redis: applying %d remote slots: %w", len(args), err)
	}
	return nil
}

// Remote returns the other replicas' counts, read from Redis, of every
// (key, window) this server merged slots into and that is still held
// (current and previous windows), in crdt.CompareSlots order. Counts merged
// only by other servers of the PoP are not included: Remote is this server's
// view for snapshots and persistence, which the others complete with theirs.
// A failure is in ReplicationErr.
func (s *Redis) Remote() []crdt.Slot {
	out, err := s.RemoteCtx(context.Background())
	s.rep.noteErr(err)
	return out
}

// RemoteCtx is Remote returning the error of a failed read with what was read.
func (s *Redis) RemoteCtx(ctx context.Context) ([]crdt.Slot, error) {
	r := s.rep
	if r == nil {
		return nil, nil
	}
	if err := s.ownerConflict(); err != nil {
		return nil, err
	}
	now := s.now()
	type pending struct {
		tk trackKey
		w  int64
	}
	var todo []pending
	r.mu.Lock()
	r.pruneLocked(now)
	for tk, w := range r.remote {
		todo = append(todo, pending{tk, w})
	}
	r.mu.Unlock()
	if len(todo) == 0 {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, replOpTimeout)
	defer cancel()
	pipe := s.client.Pipeline()
	cmds := make([]*redis.MapStringStringCmd, len(todo))
	var kbuf []byte
	for i, p := range todo {
		kbuf = appendRemoteKey(kbuf[:0], []byte(p.tk.key), floorDiv(p.tk.window, p.w))
		cmds[i] = pipe.HGetAll(ctx, string(kbuf))
	}
	_, _ = pipe.Exec(ctx)
	var out []crdt.Slot
	var errs []error
	for i, p := range todo {
		tk := p.tk
		m, err := cmds[i].Result()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for f, v := range m {
			rep, ok := strings.CutPrefix(f, "=")
			if !ok {
				continue // a running total
			}
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				errs = append(errs, fmt.Errorf("key %q replica %q: %w", tk.key, rep, err))
				continue
			}
			out = append(out, crdt.Slot{Key: tk.key, Window: tk.window, Replica: rep, Count: n})
		}
	}
	slices.SortFunc(out, crdt.CompareSlots)
	if len(errs) > 0 {
		return out, fmt.Errorf("store: redis: reading %d of %d remote hashes: %w", len(errs), len(todo), errors.Join(errs...))
	}
	return out, nil
}

// ReplicationErr returns the last failure of Delta, Own, Restore, Apply or
// Remote, or nil if the last one succeeded (or the store does not replicate).
func (s *Redis) ReplicationErr() error {
	if s.rep == nil {
		return nil
	}
	s.rep.mu.Lock()
	defer s.rep.mu.Unlock()
	return s.rep.err
}

func (r *redisReplicated) noteErr(err error) {
	if r == nil {
		return
	}
	r.mu.Lock()
	r.err = err
	r.mu.Unlock()
}

// slotWindow returns the window length and algorithm a store key built by
// rules.AppendKey names (its last bytes: 0, algorithm, unit, scope), and
// false when it names no window algorithm.
func slotWindow(key string) (int64, limit.Algorithm, bool) {
	d, ok := rules.KeyWindow(key)
	if !ok || d <= 0 {
		return 0, 0, false
	}
	alg := limit.Algorithm(key[len(key)-3])
	if !alg.Replicable() {
		return 0, 0, false
	}
	return int64(d), alg, true
}

// mergeTTL returns the TTL, in ms, of state for window index widx: until
// the end of the window after next (then the window is older than the
// previous one, and useless), plus the check script's second of grace; and
// false when that moment has passed at now.
func mergeTTL(widx, w, now int64) (int64, bool) {
	left := (widx+2)*w - now
	if left <= 0 {
		return 0, false
	}
	return (left+999_999)/1_000_000 + 1000, true
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// mergeArg is one slot for merge.lua: its Redis key, the key's Cluster slot,
// and its 4 script fields.
type mergeArg struct {
	key  string
	slot int
	a    [4]any
}

// merge runs merge.lua in mode over args: calls of up to mergeBatch slots
// (of one Cluster slot each on a Cluster), sent as one pipeline, retried
// with EVAL for a NOSCRIPT reply.
func (s *Redis) merge(ctx context.Context, mode string, args []mergeArg) error {
	if len(args) == 0 {
		return nil
	}
	if s.cluster {
		slices.SortStableFunc(args, func(a, b mergeArg) int { return cmp.Compare(a.slot, b.slot) })
	}
	type mcall struct {
		keys []string
		argv []any
		cmd  *redis.Cmd
	}
	var calls []*mcall
	for i := 0; i < len(args); {
		c := &mcall{argv: []any{mode}}
		j := i
		for ; j < len(args) && j-i < mergeBatch && (!s.cluster || args[j].slot == args[i].slot); j++ {
			c.keys = append(c.keys, args[j].key)
			c.argv = append(c.argv, args[j].a[:]...)
		}
		calls = append(calls, c)
		i = j
	}
	ctx, cancel := context.WithTimeout(ctx, replOpTimeout)
	defer cancel()
	pipe := s.client.Pipeline()
	for _, c := range calls {
		c.cmd = pipe.EvalSha(ctx, mergeScript.Hash(), c.keys, c.argv...)
	}
	_, _ = pipe.Exec(ctx)
	var retry []*mcall
	for _, c := range calls {
		if redis.HasErrorPrefix(c.cmd.Err(), "NOSCRIPT") {
			retry = append(retry, c)
		}
	}
	if len(retry) > 0 {
		pipe = s.client.Pipeline()
		for _, c := range retry {
			c.cmd = pipe.Eval(ctx, mergeLua, c.keys, c.argv...)
		}
		_, _ = pipe.Exec(ctx)
	}
	var errs []error
	for _, c := range calls {
		if err := c.cmd.Err(); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%d of %d merge calls failed: %w", len(errs), len(calls), errors.Join(errs...))
	}
	return nil
}
