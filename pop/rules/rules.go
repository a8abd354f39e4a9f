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
)

var unitNames = [...]string{"second", "minute", "hour", "day"}
var unitUpper = [...]string{"SECOND", "MINUTE", "HOUR", "DAY"}
var unitDurations = [...]time.Duration{time.Second, time.Minute, time.Hour, 24 * time.Hour}

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
	return 0, fmt.Errorf("unknown unit %q (want second, minute, hour or day)", s)
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
	Spec         limit.Spec
	Scope        Scope
	// Shadow limits are counted and reported but never deny (shadow_mode).
	Shadow bool
	// Unlimited descriptors match and stop the search but count nothing.
	Unlimited bool
	// FailClosed denies instead of deciding on local knowledge when the
	// shared counter store cannot answer.
	FailClosed bool
	// Mitigation, when set (rate_limit.mitigation.duration), is how long a
	// key that crossed this region or global limit stays denied everywhere in
	// scope (a ban); when zero, a crossing is mitigated until the sliding
	// estimate falls back under the limit.
	Mitigation time.Duration
}

// AppendKey appends the store key of this limit for a request whose descriptor
// matched with entries. Keys of different domains, descriptors, values,
// algorithms, units or scopes never collide: every part is length-prefixed, so
// no value can forge a separator. The limit's quota is not part of the key, so
// a reload that changes requests_per_unit keeps the counts.
func (l *Limit) AppendKey(dst []byte, entries []Entry) []byte {
	dst = appendPart(dst, l.Domain)
	for _, e := range entries {
		dst = appendPart(dst, e.Key)
		dst = appendPart(dst, e.Value)
	}
	return append(dst, 0, byte(l.Spec.Algorithm), byte(l.Unit), byte(l.Scope))
}

// DescribeKey renders a store key built by AppendKey for people: the domain,
// the descriptor's entries, then unit, algorithm and scope, e.g.
// "api_platform api_key=abc endpoint=POST /orders (minute sliding_window
// global)". A key AppendKey did not build is rendered as a quoted string.
func DescribeKey(key string) string {
	var parts []string
	rest := key
	next := func() (string, bool) {
		n, w := binary.Uvarint([]byte(rest))
		if w <= 0 || uint64(len(rest)-w) < n {
			return "", false
		}
		part := rest[w : w+int(n)]
		rest = rest[w+int(n):]
		return part, true
	}
	domain, ok := next()
	if !ok {
		return strconv.Quote(key)
	}
	parts = append(parts, domain)
	for len(rest) > 0 && rest[0] != 0 { // a key is never empty: 0 starts the suffix
		k, ok1 := next()
		v, ok2 := next()
		if !ok1 || !ok2 {
			return strconv.Quote(key)
		}
		parts = append(parts, k+"="+v)
	}
	if len(rest) != 4 || int(rest[2]) >= len(unitNames) {
		return strconv.Quote(key)
	}
	return fmt.Sprintf("%s (%s %s %s)", strings.Join(parts, " "), Unit(rest[2]), limit.Algorithm(rest[1]), limit.Scope(rest[3]))
}

// KeyWindow returns the window length of a store key built by AppendKey,
// read from its suffix, and false for a key AppendKey did not build.
func KeyWindow(key string) (time.Duration, bool) {
	n := len(key)
	if n < 4 || key[n-4] != 0 || int(key[n-2]) >= len(unitDurations) {
		return 0, false
	}
	return unitDurations[key[n-2]], true
}

// KeyScope returns the scope of a store key built by AppendKey, read from its
// suffix, and false for a key AppendKey did not build.
func KeyScope(key string) (limit.Scope, bool) {
	if _, ok := KeyWindow(key); !ok {
		return 0, false
	}
	return limit.Scope(key[len(key)-1]), true
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
	Tenants *Tenants
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
	any      *Node            // no value: every value gets its own counter
}

type prefixNode struct {
	prefix string
	node   *Node
}

// Child returns the child for key and value, creating it. An empty value
// matches every value; a value ending in '*' matches every value with that
// prefix (as Envoy's wildcard does).
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
		if kn.any != nil {
			out = kn.any.collect(out)
		}
	}
	return out
}

// Match returns the limits of the descriptor entries, following Envoy's
// ratelimit semantics: each entry in turn selects a child by exact value, then
// by the longest wildcard prefix, then by key alone; the limits are those of
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
