package httpapi

import (
	"unicode/utf8"
	"unsafe"

	"github.com/edgelimit/edgelimit/pop"
	"github.com/edgelimit/edgelimit/pop/rules"
)

// decodeFast decodes the common shape of a check request without reflection
// and without copying strings: {"domain": "...", "descriptors": [{"entries":
// [{"key": "...", "value": "..."}, ...]}, ...], "hits_addend": n}. It handles
// only the plain form — strings without escapes, valid UTF-8, each field at
// most once, integer hits — and reports false for anything else, so that the
// caller decodes with encoding/json, which either accepts it or names the
// problem. Where decodeFast succeeds, encoding/json (DisallowUnknownFields)
// gives the same Request; FuzzDecodeFast holds it to that.
//
// The strings of req alias body: they are valid only while body is. The
// handler keeps body until the response is written, and the engine retains
// no string of a request after CheckAt returns.
func decodeFast(body []byte, req *pop.Request) bool {
	d := decoder{b: body}
	if !d.request(req) {
		return false
	}
	d.space()
	return d.i == len(d.b)
}

// decodeBatchFast decodes {"checks": [request, ...]} as decodeFast decodes
// one request, reusing checks' memory; it reports false for anything else.
func decodeBatchFast(body []byte, checks *[]pop.Request) bool {
	d := decoder{b: body}
	if !d.byte('{') {
		return false
	}
	if key, ok := d.str(); !ok || key != "checks" || !d.byte(':') || !d.byte('[') {
		return false
	}
	cs := (*checks)[:0]
	if !d.list(func() bool {
		if len(cs) < cap(cs) {
			cs = cs[:len(cs)+1]
		} else {
			cs = append(cs, pop.Request{})
		}
		return d.request(&cs[len(cs)-1])
	}) {
		return false
	}
	*checks = cs
	if !d.byte('}') {
		return false
	}
	d.space()
	return d.i == len(d.b)
}

// request decodes one request object at the current position.
func (d *decoder) request(req *pop.Request) bool {
	req.Domain, req.HitsAddend = "", 0
	req.Descriptors = req.Descriptors[:0]
	var seenDomain, seenDescriptors, seenHits bool
	if !d.byte('{') {
		return false
	}
	if d.peek('}') {
		return false // an empty request: let encoding/json and Validate say why
	}
	for {
		key, ok := d.str()
		if !ok || !d.byte(':') {
			return false
		}
		switch {
		case key == "domain" && once(&seenDomain):
			req.Domain, ok = d.str()
		case key == "hits_addend" && once(&seenHits):
			req.HitsAddend, ok = d.int()
		case key == "descriptors" && once(&seenDescriptors):
			ok = d.descriptors(req)
		default:
			return false // unknown or repeated: encoding/json decides
		}
		if !ok {
			return false
		}
		if d.byte(',') {
			continue
		}
		return d.byte('}')
	}
}

// once reports whether *seen was false, and sets it: a field may appear once.
func once(seen *bool) bool {
	first := !*seen
	*seen = true
	return first
}

type decoder struct {
	b []byte
	i int
}

func (d *decoder) space() {
	for d.i < len(d.b) {
		switch d.b[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

// byte consumes c after optional space.
func (d *decoder) byte(c byte) bool {
	d.space()
	if d.i < len(d.b) && d.b[d.i] == c {
		d.i++
		return true
	}
	return false
}

func (d *decoder) peek(c byte) bool {
	d.space()
	return d.i < len(d.b) && d.b[d.i] == c
}

// str reads a string without escapes or control characters, aliasing d.b.
func (d *decoder) str() (string, bool) {
	if !d.byte('"') {
		return "", false
	}
	start := d.i
	ascii := true
	for d.i < len(d.b) {
		c := d.b[d.i]
		switch {
		case c == '"':
			s := d.b[start:d.i]
			d.i++
			if !ascii && !utf8.Valid(s) {
				return "", false // encoding/json would replace the bad bytes
			}
			if len(s) == 0 {
				return "", true
			}
			return unsafe.String(&s[0], len(s)), true
		case c == '\\' || c < 0x20:
			return "", false
		case c >= 0x80:
			ascii = false
		}
		d.i++
	}
	return "", false
}

// int reads a JSON integer that fits in an int64 comfortably.
func (d *decoder) int() (int64, bool) {
	d.space()
	neg := false
	if d.i < len(d.b) && d.b[d.i] == '-' {
		neg = true
		d.i++
	}
	start := d.i
	var n int64
	for d.i < len(d.b) && d.b[d.i] >= '0' && d.b[d.i] <= '9' {
		if d.i-start >= 18 {
			return 0, false
		}
		n = n*10 + int64(d.b[d.i]-'0')
		d.i++
	}
	digits := d.i - start
	if digits == 0 || (digits > 1 && d.b[start] == '0') {
		return 0, false
	}
	if d.i < len(d.b) {
		switch d.b[d.i] {
		case '.', 'e', 'E':
			return 0, false
		}
	}
	if neg {
		n = -n
	}
	return n, true
}

func (d *decoder) descriptors(req *pop.Request) bool {
	return d.byte('[') && d.list(func() bool {
		if !d.byte('{') {
			return false
		}
		key, ok := d.str()
		if !ok || key != "entries" || !d.byte(':') || !d.byte('[') {
			return false
		}
		// Reuse the pooled request's entry slices.
		var entries []rules.Entry
		if n := len(req.Descriptors); n < cap(req.Descriptors) {
			entries = req.Descriptors[:n+1][n].Entries[:0]
		}
		if !d.list(func() bool {
			e, ok := d.entry()
			if ok {
				entries = append(entries, e)
			}
			return ok
		}) || !d.byte('}') {
			return false
		}
		req.Descriptors = append(req.Descriptors, pop.Descriptor{Entries: entries})
		return true
	})
}

// list decodes the rest of an array whose '[' has been read: elements, each
// decoded by elem, separated by commas, through the closing ']'.
func (d *decoder) list(elem func() bool) bool {
	if d.byte(']') {
		return true
	}
	for {
		if !elem() {
			return false
		}
		if !d.byte(',') {
			return d.byte(']')
		}
	}
}

func (d *decoder) entry() (rules.Entry, bool) {
	var e rules.Entry
	if !d.byte('{') {
		return e, false
	}
	var seenKey, seenValue bool
	if d.byte('}') {
		return e, true
	}
	for {
		name, ok := d.str()
		if !ok || !d.byte(':') {
			return e, false
		}
		switch {
		case name == "key" && once(&seenKey):
			e.Key, ok = d.str()
		case name == "value" && once(&seenValue):
			e.Value, ok = d.str()
		default:
			return e, false
		}
		if !ok {
			return e, false
		}
		if d.byte(',') {
			continue
		}
		return e, d.byte('}')
	}
}
