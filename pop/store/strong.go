package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgelimit/edgelimit/pop/limit"
	"github.com/edgelimit/edgelimit/pop/rules"
	"github.com/edgelimit/edgelimit/region/strong"
)

// Strong limits (limit.Strong, `consistency: strong`): one home decides
// every check of a key, on one counter, and every other PoP asks it
// (region/strong, whose package doc states the model).
//
// The home is a PoP, not a region: strong.HomeOf picks the home region by a
// hash of the key over the regions that serve the limit, then one PoP of
// that region by a hash over its PoPs. The PoPs of a region keep separate
// stores; if each decided for the region, each would admit the whole limit.
// A home region whose deciding PoP is down does not move its keys to
// another PoP (which would start from an empty counter and admit the limit
// again): its checks follow the partition policy until it is back.
//
// The home decides on its own store, under the key prefixed with
// StrongKeyPrefix as a pop-scope item: one exact counter with the limit's
// algorithm, which no replicated count touches.
//
// The PoP that served a strong admission (the home for its own checks, the
// asker for the others) also counts it under the item's own key as an
// admission of an eventual limit of the item's scope, which replicates as
// every count does: it decides nothing while the home answers, and is what
// a PoP cut off from the home decides on (region/strong, "When the home
// does not answer").

// StrongKeyPrefix starts the store key under which a home counts a strong
// limit. No key a rule builds starts with a zero byte.
const StrongKeyPrefix = "\x00strong\x00"

// Asker sends a strong request to a home PoP and waits for its reply.
type Asker interface {
	// Ask sends req to the PoP named home, at now (this PoP's clock, ns),
	// and waits at most timeout (ns) for its reply. It returns the reply,
	// checked against req (strong.CheckReply), and the round trip it took
	// (ns). An error means no valid reply came: the home is unreachable, and
	// the limit's partition policy decides.
	Ask(ctx context.Context, now int64, home string, req strong.Request, timeout int64) (strong.Reply, int64, error)
}

// StrongConfig configures a Strong store.
type StrongConfig struct {
	// Self is this PoP's name, Region its region's; Regions maps every
	// region to its PoPs (the topology).
	Self, Region string
	Regions      map[string][]string
	// Asker reaches the other PoPs. It may be set later (SetAsker): until
	// then every home but this PoP counts as unreachable.
	Asker Asker
	// Floor and Initial bound the wait for a home's reply
	// (strong.RTT); 0 means DefaultStrongFloor and DefaultStrongInitial.
	Floor, Initial time.Duration
	// Observe, when set, is called after each request to a home with the
	// round trip it took, or with unreachable true when no reply came.
	Observe func(rtt time.Duration, unreachable bool)
	// PartitionShare is the operator's share of a global limit per
	// reachable region while others are cut off (edgelimit pop
	// --partition-share; 0: reachable over total), for strong.LocalShare.
	PartitionShare float64
}

// Defaults of StrongConfig. The floor is RFC 6298's least retransmission
// timeout (2.4): a request lost on the way rides TCP under NATS, and comes
// late by a retransmission, not never; a late reply taken for a lost home
// would leave the home alone for a pause, and its check, already counted at
// the home, decided again locally. So a home is taken as lost only when it
// stays silent for a second. After losses in a row it is left alone for at
// most DefaultStrongMaxBackoff.
const (
	DefaultStrongFloor      = time.Second
	DefaultStrongInitial    = time.Second
	DefaultStrongMaxBackoff = 2 * time.Second
)

// errHomeLeftAlone: the home lost requests lately, and is not asked now.
var errHomeLeftAlone = errors.New("strong: home left alone after a loss")

// StrongStats counts a Strong store's work.
type StrongStats struct {
	// Asked is the requests sent to a home; Unreachable the checks of
	// which the home gave no valid reply in time, decided by the policy
	// (FailClosedDenials of them denied, the rest decided locally).
	Asked, Unreachable, FailClosedDenials uint64
	// Answered is the requests this PoP decided as a home; Refused those
	// it refused (malformed, or not its key).
	Answered, Refused uint64
}

// Strong is a store that decides strong items at their home and passes
// every other item to its inner store, which also holds the home's
// counters. It is safe for concurrent use.
//
// A request that mixes strong items decided elsewhere with other items is
// not one atomic step: the other items are peeked at first, and the request
// is denied, with nothing spent, when one of them would deny it; the homes
// are then asked in turn, and a denial by one is final for the request;
// only then are the other items counted. A concurrent check that takes the
// room between the peek and the count can leave a home's admission spent
// on a request that is denied — as Engine.decideRepeated can.
type Strong struct {
	inner   Checker
	cfg     StrongConfig
	regions map[string][]string // the region scope's one region
	nextID  atomic.Uint64

	mu  sync.Mutex
	rtt map[string]*strong.RTT // per home PoP; requires mu

	// recent is what this PoP admitted lately as a home, per counter, by
	// the time of its clock (see MoveClock); pruned after a while.
	recentMu  sync.Mutex
	recent    map[string]*homeAdmits // requires recentMu
	prunedAt  int64                  // requires recentMu
	clockSkew atomic.Int64           // the offset SetClockOffset last set, ns

	asker                                             atomic.Pointer[Asker]
	share                                             atomic.Pointer[func() float64] // UseGlobalShare
	asked, unreachable, failClosed, answered, refused atomic.Uint64
}

// NewStrong returns a Strong store over inner.
func NewStrong(inner Checker, cfg StrongConfig) (*Strong, error) {
	if cfg.Floor == 0 {
		cfg.Floor = DefaultStrongFloor
	}
	if cfg.Initial == 0 {
		cfg.Initial = DefaultStrongInitial
	}
	switch {
	case inner == nil:
		return nil, errors.New("strong: no inner store")
	case cfg.Floor < 0 || cfg.Initial < 0:
		return nil, fmt.Errorf("strong: negative floor %v or initial wait %v", cfg.Floor, cfg.Initial)
	case !slices.Contains(cfg.Regions[cfg.Region], cfg.Self):
		return nil, fmt.Errorf("strong: PoP %q is not in region %q of the topology", cfg.Self, cfg.Region)
	}
	s := &Strong{inner: inner, cfg: cfg, rtt: map[string]*strong.RTT{}, recent: map[string]*homeAdmits{},
		regions: map[string][]string{cfg.Region: cfg.Regions[cfg.Region]}}
	if cfg.Asker != nil {
		s.SetAsker(cfg.Asker)
	}
	return s, nil
}

// SetAsker sets how s reaches the other PoPs, once their transport is up.
func (s *Strong) SetAsker(a Asker) { s.asker.Store(&a) }

// errNoAsker: no transport to the other PoPs yet.
var errNoAsker = errors.New("strong: no transport to the other PoPs yet")

// Stats returns the counts so far.
func (s *Strong) Stats() StrongStats {
	return StrongStats{Asked: s.asked.Load(), Unreachable: s.unreachable.Load(), FailClosedDenials: s.failClosed.Load(),
		Answered: s.answered.Load(), Refused: s.refused.Load()}
}

// isStrong reports whether it is decided at a home.
func isStrong(it *limit.Item) bool {
	return it.Consistency == limit.Strong && it.Scope != limit.ScopePOP
}

// HomeOf returns the home of a strong item's key, of scope sc.
func (s *Strong) HomeOf(key string, sc limit.Scope) (strong.Home, error) {
	if sc == limit.ScopeRegion {
		return strong.HomeOf(key, s.regions, "")
	}
	return strong.HomeOf(key, s.cfg.Regions, "")
}

// homeItem is the pop-scope item under which the home counts it, with the
// limit the home decides it at (homeLimit).
func (s *Strong) homeItem(it *limit.Item) limit.Item {
	key := make([]byte, 0, len(StrongKeyPrefix)+len(it.Key))
	key = append(append(key, StrongKeyPrefix...), it.Key...)
	sp := configured(it)
	sp.Limit = s.homeLimit(sp.Limit, it.Scope)
	return limit.Item{Key: key, Spec: sp, Shadow: it.Shadow, Scope: limit.ScopePOP}
}

// configured is it's spec with the limit as configured: a PoP that finds
// regions cut off holds its global limits to its share (limit.Item.Shrunk),
// which is what it may admit without the home; the home's counter, which
// every PoP that reaches the home shares, is not the asker's to shrink.
// Were the asker's share sent, the home would hold that PoP's checks to it
// and the others' to the whole limit, on one counter.
func configured(it *limit.Item) limit.Spec {
	sp := it.Spec
	if it.Shrunk && it.Unshrunk > 0 {
		sp.Limit = it.Unshrunk
	}
	return sp
}

// homeLimit is the limit a home decides a key of scope sc at, every check
// alike, its own and those it is asked: the limit as configured, and for a
// global limit while this PoP's replication core finds regions cut off,
// the share it holds (UseGlobalShare), as its engine holds every global
// limit — the regions cut off from the home decide at their share without
// it, and the two together stay within the limit.
func (s *Strong) homeLimit(configured int64, sc limit.Scope) int64 {
	if sc != limit.ScopeGlobal {
		return configured
	}
	if f := s.share.Load(); f != nil {
		if share := (*f)(); share > 0 && share < 1 {
			return int64(float64(configured) * share) // as pop.Engine shrinks it
		}
	}
	return configured
}

// UseGlobalShare gives s the share of a global limit its PoP holds while
// regions are cut off (pop.Engine.GlobalShare; 1 when none), which a home
// decides at (homeLimit). Without it a home decides at the whole limit.
func (s *Strong) UseGlobalShare(share func() float64) { s.share.Store(&share) }

// CheckAt decides items at now: strong items at their home, the others on
// the inner store (see Strong for how a mixed request is decided).
func (s *Strong) CheckAt(ctx context.Context, now, hits int64, items []limit.Item, out []limit.Decision) error {
	if !slices.ContainsFunc(items, func(it limit.Item) bool { return isStrong(&it) }) {
		return s.inner.CheckAt(ctx, now, hits, items, out)
	}
	// local are the items decided on the inner store: every item but the
	// strong ones whose home is elsewhere, and a home's own as its counter.
	local := make([]limit.Item, 0, len(items))
	at := make([]int, 0, len(items)) // local[j] is items[at[j]]
	var remote []int
	homes := make([]strong.Home, len(items))
	for i := range items {
		it := &items[i]
		if !isStrong(it) {
			local, at = append(local, *it), append(at, i)
			continue
		}
		h, err := s.HomeOf(string(it.Key), it.Scope)
		if err != nil {
			return fmt.Errorf("%w: %v", ErrInvalidCheck, err)
		}
		homes[i] = h
		if h.PoP == s.cfg.Self {
			local, at = append(local, s.homeItem(it)), append(at, i)
		} else {
			remote = append(remote, i)
		}
	}
	localOut := make([]limit.Decision, len(local))
	if len(remote) > 0 && len(local) > 0 {
		// Peek: a request the local items deny spends nothing anywhere.
		peek := slices.Clone(local)
		for j := range peek {
			peek[j].CountDenied = false
		}
		if err := s.inner.CheckAt(ctx, now, 0, peek, localOut); err != nil {
			return err
		}
		for j := range peek {
			if localOut[j].Remaining < hits && !peek[j].Shadow {
				return s.denyLocally(ctx, now, hits, items, out, local, at, localOut, remote, homes)
			}
		}
	}
	denied := false
	var fellBack []int // remote items decided locally
	for _, i := range remote {
		it := &items[i]
		h := hits
		if denied {
			h = 0 // the request is denied: only ask what remains
		}
		d, fallback, err := s.ask(ctx, now, h, it, homes[i].PoP)
		if err != nil {
			return err
		}
		if fallback {
			// Decided on local knowledge, with the other local items, as
			// an eventual limit of its scope, held to the partition share
			// if the engine does not already hold it there.
			lit := *it
			lit.Consistency = limit.Eventual
			if lit.Scope == limit.ScopeGlobal && !lit.Shrunk {
				lit.Spec.Limit = int64(float64(lit.Spec.Limit) * strong.LocalShare(len(s.cfg.Regions), s.cfg.PartitionShare))
				lit.Shrunk = true
			}
			local, at = append(local, lit), append(at, i)
			localOut = append(localOut, limit.Decision{})
			fellBack = append(fellBack, i)
			continue
		}
		out[i] = d
		if !d.Allowed && !it.Shadow {
			denied = true
		}
	}
	if len(local) == 0 {
		return s.record(ctx, now, hits, items, out, fellBack)
	}
	h := hits
	if denied {
		h = 0 // a peek: the request is denied, the local items spend nothing
		for j := range local {
			local[j].CountDenied = false
		}
	}
	if err := s.inner.CheckAt(ctx, now, h, local, localOut); err != nil {
		return err
	}
	for j, i := range at {
		out[i] = localOut[j]
	}
	if h > 0 && limit.Admit(local, localOut) {
		for j, i := range at {
			if isStrong(&items[i]) && !slices.Contains(fellBack, i) && localOut[j].Allowed {
				s.admittedAt(now, h, &local[j]) // this PoP's own check of a key it is home to
			}
		}
	}
	return s.record(ctx, now, hits, items, out, fellBack)
}

// record counts the strong items of an admitted request that their home
// admitted in the inner store's replicated counts (see Strong), but those
// in skip, which the inner store decided and counted itself.
func (s *Strong) record(ctx context.Context, now, hits int64, items []limit.Item, out []limit.Decision, skip []int) error {
	if hits == 0 || !limit.Admit(items, out) {
		return nil
	}
	var rec []limit.Item
	for i := range items {
		// Only the window algorithms replicate; the others a cut-off PoP
		// decides on its own counts alone.
		if isStrong(&items[i]) && items[i].Spec.Algorithm.Replicable() && out[i].Allowed && !slices.Contains(skip, i) {
			it := items[i]
			it.Consistency, it.Shadow, it.CountDenied = limit.Eventual, false, false
			// Room that never runs out: the home has decided, this only counts.
			it.Spec.Limit, it.Spec.Burst = recordLimit, 0
			rec = append(rec, it)
		}
	}
	if len(rec) == 0 {
		return nil
	}
	return s.inner.CheckAt(ctx, now, hits, rec, make([]limit.Decision, len(rec)))
}

// recordLimit is the limit under which record counts: more than any check
// can add in a window.
const recordLimit = 1 << 62

// denyLocally answers a request whose local items deny it: the local items
// are decided for real (their CountDenied hits counted), and the remote
// homes asked for their room with no hits.
func (s *Strong) denyLocally(ctx context.Context, now, hits int64, items []limit.Item, out []limit.Decision,
	local []limit.Item, at []int, localOut []limit.Decision, remote []int, homes []strong.Home) error {
	if err := s.inner.CheckAt(ctx, now, hits, local, localOut); err != nil {
		return err
	}
	for j, i := range at {
		out[i] = localOut[j]
	}
	for _, i := range remote {
		d, fallback, err := s.ask(ctx, now, 0, &items[i], homes[i].PoP)
		if err != nil {
			return err
		}
		if fallback {
			d = limit.Decision{Allowed: true, Remaining: 0} // room unknown; nothing spent
		}
		out[i] = d
	}
	return nil
}

// ask has home decide hits of it. fallback is true when the home did not
// answer and the limit is not fail_closed: the caller decides it locally.
func (s *Strong) ask(ctx context.Context, now, hits int64, it *limit.Item, home string) (d limit.Decision, fallback bool, err error) {
	sp := configured(it)
	req := strong.Request{ID: s.nextID.Add(1), Key: string(it.Key), Hits: hits,
		Spec: strong.Spec{Algorithm: uint8(sp.Algorithm), Limit: sp.Limit, Window: sp.Window, Burst: sp.Burst}}
	s.mu.Lock()
	r := s.rtt[home]
	if r == nil {
		r = &strong.RTT{Floor: int64(s.cfg.Floor), Initial: int64(s.cfg.Initial), MaxBackoff: int64(DefaultStrongMaxBackoff)}
		s.rtt[home] = r
	}
	timeout, asking := r.Ask(now)
	s.mu.Unlock()
	var rep strong.Reply
	var rtt int64
	askErr := errHomeLeftAlone
	if a := s.asker.Load(); a == nil {
		asking = false
		askErr = errNoAsker
	}
	if asking {
		s.asked.Add(1)
		rep, rtt, askErr = (*s.asker.Load()).Ask(ctx, now, home, req, timeout)
		if askErr == nil {
			askErr = strong.CheckReply(&req, &rep) // an Asker checks; a wrong one costs a fallback, never a wrong answer
		}
	}
	if askErr != nil {
		if ctx.Err() != nil {
			return d, false, ctx.Err() // the caller gave up: nothing to decide
		}
		s.unreachable.Add(1)
		if asking {
			s.mu.Lock()
			r.Lost(now)
			s.mu.Unlock()
		}
		if s.cfg.Observe != nil {
			s.cfg.Observe(time.Duration(timeout), true)
		}
		if strong.Unreachable(it.FailClosed) == strong.Deny {
			s.failClosed.Add(1)
			return limit.Decision{Allowed: false, RetryAfter: int64(s.cfg.Floor)}, false, nil
		}
		return d, true, nil
	}
	s.mu.Lock()
	r.Observe(rtt)
	s.mu.Unlock()
	if s.cfg.Observe != nil {
		s.cfg.Observe(time.Duration(rtt), false)
	}
	return limit.Decision{Allowed: rep.Allowed, Remaining: rep.Remaining, Reset: rep.Reset, RetryAfter: rep.Retry}, false, nil
}

// AnswerAt decides a request from another PoP, at now (this PoP's clock),
// as the home of its key: on this PoP's own counter of the key, with the
// spec the request carries. It refuses a request that is malformed, whose
// key no rule could have built or whose window is not its key's, or of
// which this PoP is not the home.
func (s *Strong) AnswerAt(ctx context.Context, now int64, req strong.Request) (strong.Reply, error) {
	rep, err := s.answerAt(ctx, now, req)
	if err != nil {
		s.refused.Add(1)
		return rep, err
	}
	s.answered.Add(1)
	return rep, nil
}

func (s *Strong) answerAt(ctx context.Context, now int64, req strong.Request) (strong.Reply, error) {
	if err := req.Validate(); err != nil {
		return strong.Reply{}, err
	}
	spec := limit.Spec{Algorithm: limit.Algorithm(req.Spec.Algorithm), Limit: req.Spec.Limit, Window: req.Spec.Window, Burst: req.Spec.Burst}
	if err := spec.Validate(); err != nil {
		return strong.Reply{}, fmt.Errorf("%w: %v", strong.ErrMalformed, err)
	}
	sc, ok := rules.KeyScope(req.Key)
	w, wok := rules.KeyWindow(req.Key)
	switch {
	case !ok || !wok || sc == limit.ScopePOP:
		return strong.Reply{}, fmt.Errorf("%w: key %q is no region or global limit's", strong.ErrMalformed, req.Key)
	case int64(w) != spec.Window:
		return strong.Reply{}, fmt.Errorf("%w: window %v, key %q counts %v", strong.ErrMalformed, time.Duration(spec.Window), req.Key, w)
	}
	h, err := s.HomeOf(req.Key, sc)
	if err != nil {
		return strong.Reply{}, err
	}
	if h.PoP != s.cfg.Self {
		return strong.Reply{}, fmt.Errorf("%w: %q's home is %s, not %s", strong.ErrMalformed, req.Key, h.PoP, s.cfg.Self)
	}
	it := s.homeItem(&limit.Item{Key: []byte(req.Key), Spec: spec, Scope: sc})
	var d [1]limit.Decision
	if err := s.inner.CheckAt(ctx, now, req.Hits, []limit.Item{it}, d[:]); err != nil {
		return strong.Reply{}, err
	}
	if d[0].Allowed {
		s.admittedAt(now, req.Hits, &it)
	}
	return strong.Reply{ID: req.ID, Key: req.Key, Allowed: d[0].Allowed, Remaining: d[0].Remaining, Reset: d[0].Reset, Retry: d[0].RetryAfter}, nil
}

// A home's clock steps: the PoPs' clock agreement corrects it (replication
// core), most of all at start, when a PoP that runs 300 ms behind the others
// learns it. The home's counter keeps the windows its hits were counted in,
// by the clock of their time. After a step forward across a window boundary
// the hits admitted in the last moments before the step lie, by the new
// clock, in the new window, yet sit in the one before, where a sliding count
// weighs them as spread over that whole window and forgets them as the new
// one slides on — a window too soon, and the home lets them in again
// within the same second (simulate/scenarios/skew.yaml: a home 300 ms
// behind, corrected early in a spray). So the home keeps
// when it admitted what, lately (homeAdmits), and on a step forward counts
// the hits the new clock puts in a later window than the old one did in the
// current window as well (MoveClock). They count twice while the old window
// weighs — the safe side; the old window's count cannot be lowered. A step
// back needs nothing: a window algorithm keeps counting in its newest window
// when the clock is behind it (limit.Spec.Advance), so hits are counted
// later, never earlier, than the new clock would put them.

// homeAdmits is what a home admitted lately on one counter: hits by the
// instant, rounded up to a grain, of the home's clock.
type homeAdmits struct {
	item  limit.Item // the home counter's item
	grain int64      // ns; a window over homeGrains
	at    []int64    // the last instant of each grain that admitted hits, ascending
	hits  []int64    // beside at
}

// homeGrains is how many grains a window's history is kept in: a step moves
// the hits of the grain its boundary cuts whole, so up to a window over
// homeGrains of hits too many count twice.
const homeGrains = 64

// admittedAt records that the home counter of it admitted hits at now.
func (s *Strong) admittedAt(now, hits int64, it *limit.Item) {
	if hits <= 0 || !it.Spec.Algorithm.Replicable() {
		return
	}
	w := it.Spec.Window
	s.recentMu.Lock()
	defer s.recentMu.Unlock()
	r := s.recent[string(it.Key)]
	if r == nil {
		rec := *it
		rec.Key = slices.Clone(it.Key)
		rec.Shadow, rec.CountDenied = false, false
		rec.Spec.Limit, rec.Spec.Burst = recordLimit, 0 // room that never runs out: it only counts
		r = &homeAdmits{item: rec, grain: max(w/homeGrains, 1)}
		s.recent[string(it.Key)] = r
	}
	at := min(limit.WindowStart(now, r.grain)+r.grain, limit.WindowStart(now, w)+w) - 1
	if n := len(r.at); n > 0 && r.at[n-1] == at {
		r.hits[n-1] += hits
	} else {
		// Checks decided at once may record a little out of order: keep
		// at ascending.
		i, _ := slices.BinarySearch(r.at, at)
		if i < n && r.at[i] == at {
			r.hits[i] += hits
		} else {
			r.at, r.hits = slices.Insert(r.at, i, at), slices.Insert(r.hits, i, hits)
		}
	}
	// Only the last two windows matter: a sliding count forgets the rest.
	drop := 0
	for drop < len(r.at) && r.at[drop] < now-2*w {
		drop++
	}
	if drop > 0 {
		r.at, r.hits = r.at[:copy(r.at, r.at[drop:])], r.hits[:copy(r.hits, r.hits[drop:])]
	}
	if now-s.prunedAt >= homePruneEvery {
		s.prunedAt = now
		for k, r := range s.recent {
			if len(r.at) == 0 || r.at[len(r.at)-1] < now-2*r.item.Spec.Window {
				delete(s.recent, k)
			}
		}
	}
}

// homePruneEvery is how often admittedAt drops the counters that admitted
// nothing for two windows.
const homePruneEvery = int64(time.Second)

// SetClockOffset takes the correction the PoPs agreed on for this PoP's
// clock (node.Config's SetClockOffset): the clock its checks and answers are
// decided on is the wall clock plus d. A change is a step (MoveClock).
func (s *Strong) SetClockOffset(ctx context.Context, d time.Duration) error {
	if old := s.clockSkew.Swap(int64(d)); old != int64(d) {
		return s.MoveClock(ctx, time.Now().UnixNano()+int64(d), int64(d)-old)
	}
	return nil
}

// MoveClock tells s that the clock it decides on stepped by d (ns), now
// (unix ns) being the new clock: the hits its home counters admitted that
// the new clock puts in a later window than the old one did are counted in
// the current window too (see homeAdmits). A driver with its own clock (the
// simulator) calls it where SetClockOffset would.
func (s *Strong) MoveClock(ctx context.Context, now, d int64) error {
	if d == 0 {
		return nil
	}
	type move struct {
		item limit.Item
		hits int64
	}
	var moves []move
	s.recentMu.Lock()
	for _, r := range s.recent {
		var n int64
		w := r.item.Spec.Window
		cur := limit.WindowStart(now, w)
		for i, t := range r.at {
			// t is the last instant of its grain: a grain the boundary
			// cuts moves whole.
			if d > 0 && limit.WindowStart(t+d, w) > limit.WindowStart(t, w) && t+d >= cur-w {
				n += r.hits[i] // into the current window, or the one before: counted now, the safe side
			}
			r.at[i] = t + d
		}
		if n > 0 {
			moves = append(moves, move{r.item, n})
		}
	}
	s.recentMu.Unlock()
	var out [1]limit.Decision
	for _, m := range moves {
		if err := s.inner.CheckAt(ctx, now, m.hits, []limit.Item{m.item}, out[:]); err != nil {
			return err
		}
	}
	return nil
}
