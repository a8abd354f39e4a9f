package pop

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// HeaderSet selects the rate limit fields a response carries, as a set of
// groups. The zero value sends none.
type HeaderSet uint8

const (
	// HeadersXRateLimit is X-RateLimit-Limit, -Remaining and -Reset (Unix
	// seconds) of the deciding limit.
	HeadersXRateLimit HeaderSet = 1 << iota
	// HeadersIETF is the IETF fields RateLimit-Policy and RateLimit.
	HeadersIETF
	// HeadersRetryAfter is Retry-After, on a denial.
	HeadersRetryAfter
	// HeadersEnvoy is Envoy's ratelimit's fields when
	// LIMIT_RESPONSE_HEADERS_ENABLED is on: the limit, the remaining and the
	// seconds until the window resets of the descriptor with the least
	// remaining (the last one over its limit, if any), named by
	// Headers.EnvoyNames.
	HeadersEnvoy
)

// DefaultHeaders is what responses carry unless configured otherwise: the
// fields of HeaderNames.
const DefaultHeaders = HeadersXRateLimit | HeadersIETF | HeadersRetryAfter

// headerGroups names the groups as ParseHeaderSet reads them.
var headerGroups = [...]struct {
	name string
	set  HeaderSet
}{
	{"x-ratelimit", HeadersXRateLimit},
	{"ietf", HeadersIETF},
	{"retry-after", HeadersRetryAfter},
	{"envoy", HeadersEnvoy},
}

// groupOf is the group of each field of HeaderNames.
var groupOf = [len(HeaderNames)]HeaderSet{HeadersXRateLimit, HeadersXRateLimit, HeadersXRateLimit, HeadersIETF, HeadersIETF, HeadersRetryAfter}

// ParseHeaderSet reads a comma-separated list of groups: x-ratelimit, ietf,
// retry-after, envoy; "edgelimit" is the first three (DefaultHeaders) and
// "none" (alone) is no fields.
func ParseHeaderSet(s string) (HeaderSet, error) {
	var set HeaderSet
	none := false
	for _, p := range strings.Split(s, ",") {
		p = strings.ToLower(strings.TrimSpace(p))
		switch p {
		case "":
			continue
		case "none":
			none = true
			continue
		case "edgelimit":
			set |= DefaultHeaders
			continue
		}
		found := false
		for _, g := range headerGroups {
			if p == g.name {
				set |= g.set
				found = true
			}
		}
		if !found {
			return 0, fmt.Errorf("unknown header group %q (want x-ratelimit, ietf, retry-after, envoy, edgelimit or none)", p)
		}
	}
	if none && set != 0 {
		return 0, fmt.Errorf("header groups %q: none cannot be combined with others", s)
	}
	if !none && set == 0 {
		return 0, fmt.Errorf("no header groups in %q (say none for no fields)", s)
	}
	return set, nil
}

func (h HeaderSet) String() string {
	if h == 0 {
		return "none"
	}
	var names []string
	for _, g := range headerGroups {
		if h&g.set != 0 {
			names = append(names, g.name)
		}
	}
	return strings.Join(names, ",")
}

// DefaultEnvoyHeaderNames are Envoy's ratelimit's names of HeadersEnvoy's
// fields (LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER, LIMIT_RESET_HEADER).
var DefaultEnvoyHeaderNames = [3]string{"RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"}

// Headers says which rate limit fields responses carry. Its zero value
// carries none; the APIs take a nil *Headers as DefaultHeaders.
type Headers struct {
	Set HeaderSet
	// EnvoyNames name HeadersEnvoy's limit, remaining and reset fields;
	// empty names are DefaultEnvoyHeaderNames'.
	EnvoyNames [3]string
}

// Field is one response field.
type Field struct{ Name, Value string }

// Default reports whether h selects exactly the fields of HeaderValues, in
// its order: a nil h, or DefaultHeaders.
func (h *Headers) Default() bool { return h == nil || h.Set == DefaultHeaders }

// AppendFields appends the fields h selects of res, decided at now, to dst:
// those of HeaderValues in its order, then the Envoy set.
func (h *Headers) AppendFields(dst []Field, now time.Time, res *Result) []Field {
	set := DefaultHeaders
	if h != nil {
		set = h.Set
	}
	if set&DefaultHeaders != 0 {
		for i, v := range HeaderValues(now, res) {
			if set&groupOf[i] != 0 {
				dst = append(dst, Field{HeaderNames[i], v})
			}
		}
	}
	if set&HeadersEnvoy != 0 {
		dst = h.appendEnvoy(dst, res)
	}
	return dst
}

// appendEnvoy appends Envoy's ratelimit's three fields for res: of the status
// with the least remaining among those with a limit, or of the last one over
// an enforced limit (not a quota-mode one), as the peer chooses; none when no
// status has a limit.
func (h *Headers) appendEnvoy(dst []Field, res *Result) []Field {
	var pick *Status
	least := int64(math.MaxUint32)
	for i := range res.Statuses {
		st := &res.Statuses[i]
		if st.Limit == nil {
			continue
		}
		if r := min(max(st.Remaining, 0), math.MaxUint32); r < least {
			pick, least = st, r
		}
	}
	for i := range res.Statuses {
		if st := &res.Statuses[i]; st.Code == OverLimit && st.Limit != nil && !st.Limit.QuotaMode {
			pick = st
		}
	}
	if pick == nil {
		return dst
	}
	var buf [64]byte
	b := strconv.AppendInt(buf[:0], min(max(pick.Limit.Spec.Limit, 0), math.MaxUint32), 10)
	e0 := len(b)
	b = strconv.AppendInt(b, min(max(pick.Remaining, 0), math.MaxUint32), 10)
	e1 := len(b)
	b = strconv.AppendInt(b, Seconds(pick.Reset), 10)
	all := string(b)
	names := DefaultEnvoyHeaderNames
	for i, n := range h.EnvoyNames {
		if n != "" {
			names[i] = n
		}
	}
	return append(dst, Field{names[0], all[:e0]}, Field{names[1], all[e0:e1]}, Field{names[2], all[e1:]})
}
