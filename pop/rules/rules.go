// Package rules is the PoP's rule set: which limits apply to a request's
// descriptors. Rule files are YAML in the shape of Envoy's ratelimit service
// (domain, nested descriptors with key and optional value, rate_limit with unit
// and requests_per_unit, shadow_mode, unlimited), so an existing Envoy ratelimit
// config loads unchanged; edgelimit's extensions live inside rate_limit
// (algorithm, burst, scope, name, fail_closed) and as rate_limits, a list of
// several limits on one descriptor, plus a forward_auth section that derives
// descriptors from a proxy's sub-request headers.
//
// A Set is immutable once built and safe for concurrent use; a reload builds a
// new Set and the engine swaps it in atomically.
package rules

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/edgelimit/edgelimit/pop/limit"
)

// Entry is one key/value pair of a request descriptor.
type Entry struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// Unit is the window of a limit.
type Unit uint8

const (
	Second Unit = iota
	Minute
	Hour
	Day
	// Week, Month and Year are fixed lengths, as Envoy's ratelimit counts
	// them: 7, 30 and 365 days, windows aligned to the Unix epoch like every
	// other unit (not to calendar months or years).
	Week
	Month
	Year
)

var unitNames = [...]string{"second", "minute", "hour", "day", "week", "month", "year"}
var unitUpper = [...]string{"SECOND", "MINUTE", "HOUR", "DAY", "WEEK", "MONTH", "YEAR"}
var unitDurations = [...]time.Duration{time.Second, time.Minute, time.Hour, 24 * time.Hour, 7 * 24 * time.Hour, 30 * 24 * time.Hour, 365 * 24 * time.Hour}

// MaxWindow bounds a limit's window (unit × unit_multiplier): ten years.
// Windows are nanoseconds in an int64, and a store keeps two of them.
const MaxWindow = 10 * 365 * 24 * time.Hour

func (u Unit) String() string {
	if int(u) < len(unitNames) {
		return unitNames[u]
	}
	return fmt.Sprintf("Unit(%d)", u)
}

// Upper is the unit as Envoy's JSON spells it (MINUTE).
func (u Unit) Upper() string {
	if int(u) < len(unitUpper) {
		return unitUpper[u]
	}
	return strings.ToUpper(u.String())
}

// Duration is the unit's window length; 0 for a unit that does not exist.
func (u Unit) Duration() time.Duration {
	if int(u) < len(unitDurations) {
		return unitDurations[u]
	}
	return 0
}

// UnmarshalText reads a unit name in either case (ParseUnit), so that JSON
// carries units as Envoy's JSON mapping does ("MINUTE").
func (u *Unit) UnmarshalText(b []byte) error {
	v, err := ParseUnit(string(b))
	if err != nil {
		return err
	}
	*u = v
	return nil
}

// ParseUnit accepts Envoy's unit names in either case.
func ParseUnit(s string) (Unit, error) {
	for i, n := range unitNames {
		if strings.EqualFold(s, n) {
			return Unit(i), nil
		}
	}
	return 0, fmt.Errorf("unknown unit %q (want second, minute, hour, day, week, month or year)", s)
}

// Scope says which replicas' hits a limit counts; see limit.Scope.
type Scope = limit.Scope

const (
	ScopePOP    = limit.ScopePOP
	ScopeRegion = limit.ScopeRegion
	ScopeGlobal = limit.ScopeGlobal
)

// ParseScope maps a rule file's scope name to a Scope; "" is ScopePOP.
func ParseScope(s string) (Scope, error) {
	if s == "" {
		return ScopePOP, nil
	}
	for sc := ScopePOP; sc <= ScopeGlobal; sc++ {
		if s == sc.String() {
			return sc, nil
		}
	}
	return 0, fmt.Errorf("unknown scope %q (want pop, region or global)", s)
}

// Limit is one limit of one descriptor in the rule set.
type Limit struct {
	// Name is the policy name reported in RateLimit-Policy. Rule files may set
	// it (rate_limit.name); otherwise it is the descriptor path, plus the unit
	// when the descriptor carries several limits.
	Name string
	// Domain and Path say where the limit sits: Path is the descriptor's keys
	// (and configured values) joined by dots, e.g. "api_key.endpoint=POST /orders".
	// Together with Name they label metrics, so they are bounded by the rule file.
	Domain, Path string
	Unit         Unit
	// Multiplier is unit_multiplier: the window is Multiplier units (a
	// custom window such as 5 minutes). 0 and 1 both mean one unit.
	Multiplier uint32
	Spec       limit.Spec
	Scope      Scope
	// Shadow limits are counted and reported but never deny (shadow_mode).
	Shadow bool
	// QuotaMode limits (Envoy's quota_mode) deny a request only together: it
	// is over when every descriptor of it that matched a quota-mode limit is
	// over one; otherwise they are counted like shadow limits.
	QuotaMode bool
	// Unlimited descriptors match and stop the search but count nothing.
	Unlimited bool
	// Metadata is the descriptor's metadata (Envoy's ratelimit's
	// metadata): JSON-like values — map[string]any, []any, string,
	// float64, bool or nil — returned in the gRPC response's dynamic
	// metadata when that is on. Shared by the descriptor's limits; read only.
	Metadata map[string]any
	// FailClosed denies instead of deciding on local knowledge when the
	// shared counter store cannot answer.
	FailClosed bool
	// Consistency is how a region or global limit holds across PoPs
	// (rate_limit.consistency); Eventual for pop-scope limits.
	Consistency limit.Consistency
	// Mitigation, when set (rate_limit.mitigation.duration), is how long a
	// key that crossed this region or global limit stays denied everywhere in
	// scope (a ban); when zero, a crossing is mitigated until the sliding
	// estimate falls back under the limit.
	Mitigation time.Duration
	// LeaseTTL, when set, makes this a concurrency limit (a descriptor's
	// concurrency field; see Concurrent).
	LeaseTTL time.Duration
	// Replaces are the limits this one replaces (Envoy's replaces): when a
	// request matches this limit, the limits listed here do not apply to it.
	Replaces []*Limit
	// Shared, when set, holds for each entry of the descriptor the wildcard
	// pattern whose matches share one counter (Envoy's share_threshold), or
	// "" where the entry's own value names the counter.
	Shared []string

	configured string   // the configured name, "" when derived
	replaces   []string // names of the limits it replaces, until resolved
}

// ConfiguredName is the name the rule file gave the limit (rate_limit.name),
// "" when Name is derived from the descriptor path.
func (l *Limit) ConfiguredName() string { return l.configured }

// Window is the limit's window: its unit times its multiplier.
func (l *Limit) Window() time.Duration {
	return l.Unit.Duration() * time.Duration(max(l.Multiplier, 1))
}

// AppendKey appends the store key of this limit for a request whose descriptor
// matched with entries. Keys of different domains, descriptors, values,
// algorithms, units or scopes never collide: every part is length-prefixed, so
// no value can forge a separator. The limit's quota is not part of the key, so
// a reload that changes requests_per_unit keeps the counts.
//
// The key ends in 0, algorithm, unit, scope; a limit whose unit_multiplier is
// above 1 puts the multiplier (4 bytes, big-endian) after the 0 and sets the
// unit byte's high bit, so the keys of plain units are as they always were.
func (l *Limit) AppendKey(dst []byte, entries []Entry) []byte {
	dst = appendPart(dst, l.Domain)
	for i, e := range entries {
		dst = appendPart(dst, e.Key)
		if i < len(l.Shared) && l.Shared[i] != "" {
			dst = appendPart(dst, l.Shared[i])
			continue
		}
		dst = appendPart(dst, e.Value)
	}
	if l.Multiplier > 1 {
		dst = append(dst, 0)
		dst = binary.BigEndian.AppendUint32(dst, l.Multiplier)
		return append(dst, byte(l.Spec.Algorithm), byte(l.Unit)|multiplied, byte(l.Scope))
	}
	return append(dst, 0, byte(l.Spec.Algorithm), byte(l.Unit), byte(l.Scope))
}

// multiplied marks the unit byte of a key whose suffix holds a multiplier.
const multiplied = 0x80

// keySuffix splits the suffix of a store key built by AppendKey: the length
// of the suffix (from its 0 byte), algorithm, unit, multiplier and scope.
func keySuffix(key string) (n int, alg limit.Algorithm, unit Unit, mult uint32, scope limit.Scope, ok bool) {
	k := len(key)
	if k < 4 {
		return 0, 0, 0, 0, 0, false
	}
	u := key[k-2]
	n, mult = 4, 1
	if u&multiplied != 0 {
		if k < 8 {
			return 0, 0, 0, 0, 0, false
		}
		n, mult = 8, binary.BigEndian.Uint32([]byte(key[k-7:k-3]))
		u &^= multiplied
	}
	if key[k-n] != 0 || int(u) >= len(unitDurations) {
		return 0, 0, 0, 0, 0, false
	}
	return n, limit.Algorithm(key[k-3]), Unit(u), mult, limit.Scope(key[k-1]), true
}

// DescribeKey renders a store key built by AppendKey for people: the domain,
// the descriptor's entries, then unit, algorithm and scope, e.g.
// "api_platform api_key=abc endpoint=POST /orders (minute sliding_window
// global)". A key AppendKey did not build is rendered as a quoted string.
func DescribeKey(key string) string {
	var buf [maxKeyEntries]Entry
	k, ok := ParseKey(key, buf[:0])
	if !ok {
		return strconv.Quote(key)
	}
	parts := []string{k.Domain}
	for _, e := range k.Entries {
		parts = append(parts, e.Key+"="+e.Value)
	}
	window := k.Unit.String()
	if k.Multiplier > 1 {
		window = strconv.FormatUint(uint64(k.Multiplier), 10) + "×" + window
	}
	return fmt.Sprintf("%s (%s %s %s)", strings.Join(parts, " "), window, k.Algorithm, k.Scope)
}

// maxKeyEntries is room for the entries of most keys without allocating.
const maxKeyEntries = 16

// Key is a store key built by AppendKey, read back by ParseKey.
type Key struct {
	Domain    string
	Entries   []Entry
	Algorithm limit.Algorithm
	Unit      Unit
	// Multiplier is the limit's unit_multiplier, 1 when it has none.
	Multiplier uint32
	Scope      Scope
}

// Window is the key's window: Multiplier units.
func (k Key) Window() time.Duration { return k.Unit.Duration() * time.Duration(max(k.Multiplier, 1)) }

// ParseKey reads a store key built by AppendKey, appending its entries to
// entries (pass a buffer to avoid allocating); the strings alias key. It
// returns false for a key AppendKey did not build.
func ParseKey(key string, entries []Entry) (Key, bool) {
	rest := key
	next := func() (string, bool) {
		n, w := uvarint(rest)
		if w <= 0 || uint64(len(rest)-w) < n {
			return "", false
		}
		part := rest[w : w+int(n)]
		rest = rest[w+int(n):]
		return part, true
	}
	domain, ok := next()
	if !ok {
		return Key{}, false
	}
	k := Key{Domain: domain, Entries: entries}
	for len(rest) > 0 && rest[0] != 0 { // a key is never empty: 0 starts the suffix
		ek, ok1 := next()
		ev, ok2 := next()
		if !ok1 || !ok2 {
			return Key{}, false
		}
		k.Entries = append(k.Entries, Entry{Key: ek, Value: ev})
	}
	n, alg, unit, mult, scope, ok := keySuffix(rest)
	if !ok || n != len(rest) {
		return Key{}, false
	}
	k.Algorithm, k.Unit, k.Multiplier, k.Scope = alg, unit, mult, scope
	return k, true
}

// KeyWindow returns the window length of a store key built by AppendKey,
// read from its suffix, and false for a key AppendKey did not build.
func KeyWindow(key string) (time.Duration, bool) {
	_, _, unit, mult, _, ok := keySuffix(key)
	if !ok {
		return 0, false
	}
	return unit.Duration() * time.Duration(mult), true
}

// KeyScope returns the scope of a store key built by AppendKey, read from its
// suffix, and false for a key AppendKey did not build.
func KeyScope(key string) (limit.Scope, bool) {
	_, _, _, _, scope, ok := keySuffix(key)
	return scope, ok
}

// uvarint is binary.Uvarint of a string, without copying it to bytes.
func uvarint(s string) (uint64, int) {
	var x uint64
	var shift uint
	for i := 0; i < len(s) && i < binary.MaxVarintLen64; i++ {
		c := s[i]
		if c < 0x80 {
			if i == binary.MaxVarintLen64-1 && c > 1 {
				return 0, -(i + 1) // overflow
			}
			return x | uint64(c)<<shift, i + 1
		}
		x |= uint64(c&0x7f) << shift
		shift += 7
	}
	return 0, 0
}

func appendPart(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// Set is a loaded rule set: domains by name. The zero Set has no domains.
type Set struct {
	domains map[string]*Domain
}

// NewSet builds a Set from domains; names must be unique.
func NewSet(domains ...*Domain) (*Set, error) {
	s := &Set{domains: make(map[string]*Domain, len(domains))}
	for _, d := range domains {
		if _, dup := s.domains[d.Name]; dup {
			return nil, fmt.Errorf("domain %q is defined twice", d.Name)
		}
		s.domains[d.Name] = d
	}
	return s, nil
}

// Domain returns the named domain, or nil.
func (s *Set) Domain(name string) *Domain {
	if s == nil {
		return nil
	}
	return s.domains[name]
}

// Domains returns every domain, in no particular order.
func (s *Set) Domains() []*Domain {
	out := make([]*Domain, 0, len(s.domains))
	for _, d := range s.domains {
		out = append(out, d)
	}
	return out
}

// Limits returns every limit of every domain.
func (s *Set) Limits() []*Limit {
	var out []*Limit
	for _, d := range s.domains {
		out = d.root.collect(out)
		if t := d.Tenants; t != nil {
			for _, name := range t.names {
				out = append(out, t.tiers[name]...)
			}
		}
	}
	return out
}

// Domain is one domain's descriptor tree.
type Domain struct {
	Name string
	// File is where the domain was loaded from, for messages.
	File string
	root Node
	// ForwardAuth derives descriptors from a proxy's sub-request; nil when
	// the domain does not serve /v1/authz.
	ForwardAuth *ForwardAuth
	// Tenants, when set, are the domain's tiers and tenant entry (tenant.go).
	Tenants  *Tenants
	replaces bool // a limit has Replaces
}

// NewDomain returns a domain whose descriptor tree is root.
func NewDomain(name, file string, root *Node) *Domain {
	return &Domain{Name: name, File: file, root: *root}
}

// Node is a point of the descriptor tree: the limits a descriptor ending here
// gets, and the children its next entry may lead to. Build it with Child and
// Add; a built tree is read-only.
type Node struct {
	children map[string]*keyNode // by entry key
	limits   []*Limit
}

type keyNode struct {
	values   map[string]*Node // exact value
	prefixes []prefixNode     // value "abc*", longest first
	globs    []globNode       // values with '*' elsewhere ("a*b", "a*b*"), in file order
	any      *Node            // no value: every value gets its own counter
}

// globNode is a wildcard value with a '*' before its end, split on '*'.
type globNode struct {
	pattern string
	parts   []string
	node    *Node
}

// globMatch reports whether v matches the pattern split on '*' into parts
// (at least two): v starts with the first part, ends with the last, and holds
// the middle ones in order between them; each '*' matches any run of bytes,
// the empty one too.
func globMatch(parts []string, v string) bool {
	first, last := parts[0], parts[len(parts)-1]
	if len(v) < len(first)+len(last) || !strings.HasPrefix(v, first) || !strings.HasSuffix(v, last) {
		return false
	}
	mid := v[len(first) : len(v)-len(last)]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(mid, p)
		if i < 0 {
			return false
		}
		mid = mid[i+len(p):]
	}
	return true
}

type prefixNode struct {
	prefix string
	node   *Node
}

// Child returns the child for key and value, creating it. An empty value
// matches every value; a value ending in '*' matches every value with that
// prefix, and a '*' elsewhere matches any run of bytes there (as Envoy's
// wildcards do).
func (n *Node) Child(key, value string) *Node {
	if n.children == nil {
		n.children = make(map[string]*keyNode)
	}
	kn := n.children[key]
	if kn == nil {
		kn = &keyNode{}
		n.children[key] = kn
	}
	switch {
	case value == "":
		if kn.any == nil {
			kn.any = &Node{}
		}
		return kn.any
	case strings.Contains(strings.TrimSuffix(value, "*"), "*"):
		for _, g := range kn.globs {
			if g.pattern == value {
				return g.node
			}
		}
		c := &Node{}
		kn.globs = append(kn.globs, globNode{value, strings.Split(value, "*"), c})
		return c
	case strings.HasSuffix(value, "*"):
		p := strings.TrimSuffix(value, "*")
		for _, pn := range kn.prefixes {
			if pn.prefix == p {
				return pn.node
			}
		}
		c := &Node{}
		kn.prefixes = append(kn.prefixes, prefixNode{p, c})
		// Longest prefix first, so the most specific wildcard wins.
		for i := len(kn.prefixes) - 1; i > 0 && len(kn.prefixes[i].prefix) > len(kn.prefixes[i-1].prefix); i-- {
			kn.prefixes[i], kn.prefixes[i-1] = kn.prefixes[i-1], kn.prefixes[i]
		}
		return c
	default:
		if kn.values == nil {
			kn.values = make(map[string]*Node)
		}
		c := kn.values[value]
		if c == nil {
			c = &Node{}
			kn.values[value] = c
		}
		return c
	}
}

// Add attaches limits to the node.
func (n *Node) Add(l ...*Limit) { n.limits = append(n.limits, l...) }

// Limits returns the node's own limits.
func (n *Node) Limits() []*Limit { return n.limits }

func (n *Node) collect(out []*Limit) []*Limit {
	out = append(out, n.limits...)
	for _, kn := range n.children {
		for _, c := range kn.values {
			out = c.collect(out)
		}
		for _, p := range kn.prefixes {
			out = p.node.collect(out)
		}
		for _, g := range kn.globs {
			out = g.node.collect(out)
		}
		if kn.any != nil {
			out = kn.any.collect(out)
		}
	}
	return out
}

// Match returns the limits of the descriptor entries, following Envoy's
// ratelimit semantics: each entry in turn selects a child by exact value, then
// by the longest wildcard prefix ("abc*"), then by the first other wildcard
// pattern in file order ("a*b", "a*b*c"), then by key alone; the limits are those of
// the node the last entry reaches. A descriptor that leaves the tree early, or
// ends on a node without limits, matches nothing. The result aliases the rule
// set: do not modify it. Match does not allocate.
func (d *Domain) Match(entries []Entry) []*Limit {
	n := &d.root
	for _, e := range entries {
		kn := n.children[e.Key]
		if kn == nil {
			return nil
		}
		next := kn.values[e.Value]
		if next == nil {
			for _, p := range kn.prefixes {
				if strings.HasPrefix(e.Value, p.prefix) {
					next = p.node
					break
				}
			}
		}
		if next == nil {
			for i := range kn.globs {
				if globMatch(kn.globs[i].parts, e.Value) {
					next = kn.globs[i].node
					break
				}
			}
		}
		if next == nil {
			next = kn.any
		}
		if next == nil {
			return nil
		}
		n = next
	}
	if len(entries) == 0 {
		return nil
	}
	return n.limits
}

// ForwardAuth maps a proxy's forward-auth sub-request (nginx auth_request,
// Traefik ForwardAuth, Envoy ext_authz over HTTP) to descriptors.
type ForwardAuth struct {
	// DenyStatus is the status of a denial: 429 by default, 403 for nginx,
	// whose auth_request treats any status but 2xx, 401 and 403 as an error.
	DenyStatus int
	// Descriptors are built in order; a descriptor any of whose entries has no
	// value in the sub-request (a missing header) is left out, as Envoy's
	// rate limit actions do.
	Descriptors [][]AuthEntry
}

// AuthEntry is one entry of a forward-auth descriptor.
type AuthEntry struct {
	Key string
	// From names where the value comes from: "client_ip" (X-Real-IP, else the
	// last X-Forwarded-For address, which the proxy appended, else the peer), "method" and "path"
	// (X-Original-Method/-URI or X-Forwarded-Method/-Uri, else the request's
	// own), "method_path" ("POST /orders"), "host" (X-Forwarded-Host, else Host),
	// or "header:Name" for any header. Empty when Value is a constant.
	From string
	// Value is a constant value, used when From is empty.
	Value string
}

// AuthSources lists the valid From values other than "header:Name".
var AuthSources = []string{"client_ip", "method", "path", "method_path", "host"}
