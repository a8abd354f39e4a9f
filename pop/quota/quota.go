package quota

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgelimit/edgelimit/pop/rules"
)

// Bounds of a quota, as the PostgreSQL schema holds them.
const (
	MaxKeyBytes        = 64
	MaxTierBytes       = 64
	MaxDescriptorBytes = 256
	MaxOverrides       = 64
	MaxRequestsPerUnit = 1<<31 - 1
)

// ErrNotFound is returned by Store.Get and Store.Delete for an API key
// without a quota.
var ErrNotFound = errors.New("quota: no quota for this api_key")

// Override replaces, for one API key, the quota of the limit named
// Descriptor (a tier limit or a limit of a descriptor below the tenant entry;
// its name as RateLimit-Policy reports it).
type Override struct {
	Descriptor      string     `json:"descriptor"`
	RequestsPerUnit int64      `json:"requests_per_unit"`
	Unit            rules.Unit `json:"-"`
}

// Time is an instant in Unix nanoseconds; 0 is unset. Quotas hold times so
// (8 bytes, not time.Time's 24), since a PoP holds a million of them.
type Time int64

// TimeOf returns t as a Time; the zero time.Time is 0.
func TimeOf(t time.Time) Time {
	if t.IsZero() {
		return 0
	}
	return Time(t.UnixNano())
}

// Time returns t as a time.Time in UTC; 0 is the zero time.Time.
func (t Time) Time() time.Time {
	if t == 0 {
		return time.Time{}
	}
	return time.Unix(0, int64(t)).UTC()
}

// IsZero reports whether t is unset.
func (t Time) IsZero() bool { return t == 0 }

// Quota is one API key's tier and overrides. EffectiveAt (zero: always) and
// ExpiresAt (zero: never) bound when it is in force; outside that time the
// key is limited as a key without a quota (the default tier, the rules'
// limits). It is plain data: the check path reads a key's Plan instead (see
// Index.QuotaAt).
type Quota struct {
	APIKey      string
	Tier        string // "" is the domain's default tier
	Overrides   []Override
	EffectiveAt Time
	ExpiresAt   Time
	UpdatedAt   Time
}

// Prepare returns q (kept for callers that build quotas by hand: there is
// nothing left to prepare).
func (q *Quota) Prepare() *Quota { return q }

// InForceAt reports whether q applies at now (Unix ns).
func (q *Quota) InForceAt(now int64) bool { return inForce(now, q.EffectiveAt, q.ExpiresAt) }

func inForce(now int64, effectiveAt, expiresAt Time) bool {
	return now >= int64(effectiveAt) && (expiresAt == 0 || now < int64(expiresAt))
}

// Clone returns a copy of q.
func (q *Quota) Clone() *Quota {
	c := *q
	c.Overrides = append([]Override(nil), q.Overrides...)
	return &c
}

// Override returns the override of the limit named name, or nil.
func (q *Quota) Override(name string) *Override { return overrideIn(q.Overrides, name) }

func overrideIn(os []Override, name string) *Override {
	for i := range os {
		if os[i].Descriptor == name {
			return &os[i]
		}
	}
	return nil
}

// Plan returns a new plan of q's tier and overrides (an Index shares one
// among the keys that have the same).
func (q *Quota) Plan() *Plan { return &Plan{Tier: q.Tier, Overrides: q.Overrides} }

// Plan is what the check path needs of a key's quota: its tier and
// overrides. An Index holds one Plan for every distinct tier and overrides
// and shares it among the keys that have them, so that the memo of the
// limits it met lives once per plan, not once per key: customers on one
// contract have one plan, and a million keys hold a handful of pointers for
// the garbage collector, not millions (the keys themselves are held in
// pointer-free arrays, table.go). Its fields are read-only once built; it is
// safe for concurrent use.
type Plan struct {
	Tier      string // "" is the domain's default tier
	Overrides []Override

	memo atomic.Pointer[memoNode]
	last atomic.Pointer[limitPair] // the pair remembered last
}

// maxMemo bounds the limits one plan remembers; past it, the memo starts
// over (rule reloads leave old limits behind).
const maxMemo = 16

// limitPair says that limit from applies as to (to == from when no override
// names it). Pairs are shared among plans (sharedLimits): every plan with the
// same override of a limit holds the same pair, which stays in the CPU's
// caches however many keys there are.
type limitPair struct{ from, to *rules.Limit }

// memoNode is one remembered pair of a plan's memo (besides the last one):
// an immutable list, newest first. A key meets a handful of limits.
type memoNode struct {
	pair *limitPair
	next *memoNode
	n    int // nodes from this one to the end
}

// Limit returns the limit that applies to a key of this plan in place of l:
// l itself when no override names it (or p is nil), else the limit with the
// override's quota and unit (Overridden), shared by every plan with the same
// override of l. It is remembered per limit, so that after the first check
// of a plan with overrides, Limit does not allocate, and for the limit it
// remembered last (a key with one tier limit: every check) it reads the
// plan and one shared pair.
func (p *Plan) Limit(l *rules.Limit) *rules.Limit {
	if p == nil || len(p.Overrides) == 0 {
		return l
	}
	if lp := p.last.Load(); lp != nil && lp.from == l {
		return lp.to
	}
	m := p.memo.Load()
	for n := m; n != nil; n = n.next {
		if n.pair.from == l { // last stays: the check path writes nothing shared
			return n.pair.to
		}
	}
	var lp *limitPair
	if o := overrideIn(p.Overrides, l.Name); o != nil {
		lp = sharedLimits.overridden(l, o)
	} else {
		lp = sharedLimits.same(l)
	}
	// The first pair is remembered in last alone; once last is taken, it
	// moves to the list as a new pair takes its place.
	if prev := p.last.Load(); prev != nil {
		if m != nil && m.n >= maxMemo {
			m = nil
		}
		next := &memoNode{pair: prev, next: m, n: 1}
		if m != nil {
			next.n += m.n
		}
		p.memo.Store(next) // a racing store loses an entry, recomputed next time
	}
	p.last.Store(lp)
	return lp.to
}

// limitPairs shares pairs among quotas: keys with the same override of a
// limit (the same quota and unit, as customers on one contract have) get one
// pair and one overridden *rules.Limit, so that checks of many keys read one
// hot limit, not one each, and a million quotas do not hold a million
// copies. It is safe for concurrent use; only a key's first check of a limit
// asks it.
type limitPairs struct {
	mu sync.Mutex
	m  map[pairKey]*limitPair
}

// pairKey names a pair: limit l with an override of rpu per unit, or l
// unchanged when same.
type pairKey struct {
	l    *rules.Limit
	rpu  int64
	unit rules.Unit
	same bool
}

// maxShared bounds the pairs shared; past it the map starts over (rule
// reloads leave old limits behind; a pair already handed out stays valid).
const maxShared = 1 << 16

var sharedLimits limitPairs

// overridden returns the pair of l with o's quota, or of l unchanged when l
// cannot take it (Overridden fails).
func (s *limitPairs) overridden(l *rules.Limit, o *Override) *limitPair {
	return s.get(pairKey{l: l, rpu: o.RequestsPerUnit, unit: o.Unit}, func() *rules.Limit {
		if c, err := Overridden(l, o); err == nil {
			return c
		}
		return l
	})
}

// same returns the pair of l unchanged.
func (s *limitPairs) same(l *rules.Limit) *limitPair {
	return s.get(pairKey{l: l, same: true}, func() *rules.Limit { return l })
}

func (s *limitPairs) get(k pairKey, to func() *rules.Limit) *limitPair {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p, ok := s.m[k]; ok {
		return p
	}
	if s.m == nil || len(s.m) >= maxShared {
		s.m = make(map[pairKey]*limitPair)
	}
	p := &limitPair{from: k.l, to: to()}
	s.m[k] = p
	return p
}

// Overridden returns a copy of l with o's quota: RequestsPerUnit per Unit,
// counted as l counts (algorithm, scope), the burst of a bucket becoming the
// new quota. The store key includes the unit, so an override with l's unit
// keeps l's counts and one with another unit counts on its own. It fails when
// l's algorithm cannot hold that quota (sliding_log's bound).
func Overridden(l *rules.Limit, o *Override) (*rules.Limit, error) {
	c := *l
	c.Unit = o.Unit
	c.Spec.Limit, c.Spec.Window, c.Spec.Burst = o.RequestsPerUnit, int64(o.Unit.Duration()), 0
	if err := c.Spec.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// FieldError is a quota that does not validate; Field names the part in the
// admin API's JSON terms, e.g. "overrides[1].unit".
type FieldError struct {
	Field, Msg string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Msg }

// ValidateKey checks an API key: 1 to MaxKeyBytes printable ASCII bytes.
func ValidateKey(key string) error {
	if key == "" {
		return &FieldError{"api_key", "is required"}
	}
	if len(key) > MaxKeyBytes {
		return &FieldError{"api_key", fmt.Sprintf("is %d bytes, the limit is %d", len(key), MaxKeyBytes)}
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c <= ' ' || c > '~' {
			return &FieldError{"api_key", fmt.Sprintf("byte %d (%q) is not printable ASCII", i, c)}
		}
	}
	return nil
}

// Validate checks q's own bounds (not whether the rule set knows its tier and
// limits; see the admin API).
func (q *Quota) Validate() error {
	if err := ValidateKey(q.APIKey); err != nil {
		return err
	}
	if len(q.Tier) > MaxTierBytes || strings.ContainsAny(q.Tier, " \t\r\n\"\\") {
		return &FieldError{"tier", fmt.Sprintf("must be at most %d bytes without spaces, quotes or backslashes", MaxTierBytes)}
	}
	if len(q.Overrides) > MaxOverrides {
		return &FieldError{"overrides", fmt.Sprintf("%d overrides, the limit is %d", len(q.Overrides), MaxOverrides)}
	}
	for i, o := range q.Overrides {
		f := overrideField(i)
		switch {
		case o.Descriptor == "":
			return &FieldError{f.String() + ".descriptor", "is required: the name of the limit to override"}
		case len(o.Descriptor) > MaxDescriptorBytes:
			return &FieldError{f.String() + ".descriptor", fmt.Sprintf("is %d bytes, the limit is %d", len(o.Descriptor), MaxDescriptorBytes)}
		case o.RequestsPerUnit < 0 || o.RequestsPerUnit > MaxRequestsPerUnit:
			return &FieldError{f.String() + ".requests_per_unit", fmt.Sprintf("must be between 0 and %d, got %d", MaxRequestsPerUnit, o.RequestsPerUnit)}
		case o.Unit.Duration() <= 0 || o.Unit > rules.Day:
			// The quota stores hold these four (PostgreSQL's CHECK on
			// quota_overrides.unit): a longer unit is refused here, as a bad
			// field, not by the database as a failure.
			return &FieldError{f.String() + ".unit", fmt.Sprintf("must be second, minute, hour or day, got %s", o.Unit)}
		}
		for j := range i { // at most MaxOverrides: no map needed
			if q.Overrides[j].Descriptor == o.Descriptor {
				return &FieldError{f.String() + ".descriptor", fmt.Sprintf("%q is already overridden by overrides[%d]", o.Descriptor, j)}
			}
		}
	}
	if q.ExpiresAt != 0 && q.ExpiresAt <= q.EffectiveAt {
		return &FieldError{"expires_at", "must be after effective_at"}
	}
	return nil
}

// overrideField names overrides[i] in a FieldError; a function, so that
// validating a good quota (a million of them when a snapshot loads) does not
// format the name.
type overrideField int

func (i overrideField) String() string { return fmt.Sprintf("overrides[%d]", int(i)) }

// Change is one API key's new state: its quota, or nil when it was deleted.
type Change struct {
	APIKey string
	Quota  *Quota
}

// AuditEntry is one change as the audit trail records it.
type AuditEntry struct {
	ID     int64     `json:"id"`
	APIKey string    `json:"api_key"`
	Actor  string    `json:"actor"`
	At     time.Time `json:"at"`
	Before *Wire     `json:"before"`
	After  *Wire     `json:"after"`
}

// Store keeps quotas and their audit trail. Every write appends one audit
// entry in the same transaction; versions are audit ids, increasing in the
// order writes commit.
type Store interface {
	// Get returns key's quota, or ErrNotFound.
	Get(ctx context.Context, key string) (*Quota, error)
	// Put creates or replaces q (validated) on behalf of actor and returns
	// the quota it replaced (nil when there was none).
	Put(ctx context.Context, q *Quota, actor string) (before *Quota, err error)
	// Delete removes key's quota on behalf of actor and returns it, or
	// ErrNotFound.
	Delete(ctx context.Context, key, actor string) (before *Quota, err error)
	// List returns up to limit quotas of tier ("" for every tier) whose keys
	// sort after after, in key order.
	List(ctx context.Context, tier, after string, limit int) ([]*Quota, error)
	// Audit returns key's audit entries, newest first, up to limit.
	Audit(ctx context.Context, key string, limit int) ([]AuditEntry, error)
	// Snapshot returns every quota and the version it reflects.
	Snapshot(ctx context.Context) ([]*Quota, int64, error)
	// ChangesSince returns the state of every key changed after version, and
	// the version the changes bring a snapshot to.
	ChangesSince(ctx context.Context, version int64) ([]Change, int64, error)
	// Watch calls changed soon after each write, by any process, until ctx
	// ends or the notification channel fails (then it returns the error).
	Watch(ctx context.Context, changed func()) error
	Close()
}
