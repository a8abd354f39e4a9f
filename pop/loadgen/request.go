package loadgen

import (
	"encoding/binary"
	"encoding/json"
	"math/rand/v2"
	"strconv"

	"google.golang.org/protobuf/encoding/protowire"
)

// drawer draws one worker's descriptor values as their indexes in
// [0, keySpace): uniform or Zipf over Config.Keys, always 0 (the value
// "hot") for HotKey. Worker idx's drawer is seeded with Seed+idx, so a
// worker's sequence of values is the same in every run of a seed. Only its
// worker's goroutine uses it.
type drawer struct {
	dist Distribution
	keys int
	rng  *rand.Rand
	zipf *rand.Zipf
}

func newDrawer(c *Config, idx int) drawer {
	d := drawer{dist: c.Dist, keys: c.Keys, rng: rand.New(rand.NewPCG(c.Seed+uint64(idx), 0x9e3779b97f4a7c15))}
	if c.Dist == Zipf {
		d.zipf = rand.NewZipf(d.rng, c.ZipfS, 1, uint64(c.Keys-1))
	}
	return d
}

// next draws the index of the next value.
func (d *drawer) next() uint64 {
	switch d.dist {
	case Uniform:
		return uint64(d.rng.IntN(d.keys))
	case Zipf:
		return d.zipf.Uint64()
	}
	return 0
}

// appendValue appends the descriptor value of index i to b: "hot" for
// HotKey, "k" and the number otherwise.
func appendValue(b []byte, dist Distribution, i uint64) []byte {
	if dist == HotKey {
		return append(b, "hot"...)
	}
	return strconv.AppendUint(append(b, 'k'), i, 10)
}

// keySpace is how many distinct values cfg's distribution draws from.
func keySpace(c *Config) uint64 {
	if c.Dist == HotKey {
		return 1
	}
	return uint64(c.Keys)
}

// renderer renders one worker's requests as they are sent, each with values
// drawn afresh, into a buffer it reuses: the steady state allocates nothing.
// An HTTP request is written body first, after room for the head, and its
// head (whose Content-Length is the body's) is then copied in just before
// the body, so the body is not copied. A hot-key request never changes and
// is rendered once. Only its worker's goroutine uses it.
type renderer struct {
	draw   drawer
	keys   *keySet
	grpc   bool
	checks int  // checks a request (HTTP; gRPC requests have one)
	batch  bool // checks go in {"checks":[…]} to /v1/check/batch

	head      []byte // HTTP: request line and headers up to Content-Length's value
	pre, post []byte // HTTP: a check's JSON before and after its value
	room      int    // HTTP: bytes kept before the body for the head

	domain, key string // gRPC

	buf   []byte
	drawn []uint64 // indexes of the values in the last request rendered
	fixed []byte   // the hot-key request, once rendered
}

// maxValueLen bounds an appended value: "k" and a uint64.
const maxValueLen = 21

func newRenderer(t *target, idx int, keys *keySet) *renderer {
	c := &t.cfg
	r := &renderer{draw: newDrawer(c, idx), keys: keys, grpc: c.GRPC != "", checks: max(c.Batch, 1), batch: c.Batch > 0}
	if r.grpc {
		r.domain, r.key = c.Domain, c.Key
		r.buf = make([]byte, 0, 5+32+len(c.Domain)+len(c.Key)+maxValueLen)
	} else {
		domain, _ := json.Marshal(c.Domain) // strings always marshal
		key, _ := json.Marshal(c.Key)
		r.head = []byte("POST " + t.path + " HTTP/1.1\r\nHost: " + t.host + "\r\nContent-Type: application/json\r\nContent-Length: ")
		r.pre = []byte(`{"domain":` + string(domain) + `,"descriptors":[{"entries":[{"key":` + string(key) + `,"value":"`)
		r.post = []byte(`"}]}],"hits_addend":1}`)
		r.room = len(r.head) + 20 + 4 // 20 digits of Content-Length, CRLF CRLF
		r.buf = make([]byte, 0, r.room+len(`{"checks":[]}`)+r.checks*(len(r.pre)+len(r.post)+maxValueLen+1))
	}
	r.drawn = make([]uint64, 0, r.checks)
	return r
}

// render returns the next request, valid until the next call.
func (r *renderer) render() []byte {
	if r.fixed != nil {
		return r.fixed
	}
	var req []byte
	if r.grpc {
		req = r.renderGRPC()
	} else {
		req = r.renderHTTP()
	}
	if r.draw.dist == HotKey {
		r.fixed = req
	}
	return req
}

func (r *renderer) renderHTTP() []byte {
	b := r.buf[:r.room]
	r.drawn = r.drawn[:0]
	if r.batch {
		b = append(b, `{"checks":[`...)
	}
	for k := range r.checks {
		if k > 0 {
			b = append(b, ',')
		}
		i := r.draw.next()
		r.drawn = append(r.drawn, i)
		b = append(b, r.pre...)
		b = appendValue(b, r.draw.dist, i)
		b = append(b, r.post...)
	}
	if r.batch {
		b = append(b, "]}"...)
	}
	r.buf = b
	var num [20]byte
	clen := strconv.AppendInt(num[:0], int64(len(b)-r.room), 10)
	start := r.room - 4 - len(clen) - len(r.head)
	copy(b[start:], r.head)
	copy(b[start+len(r.head):], clen)
	copy(b[r.room-4:], "\r\n\r\n")
	return b[start:]
}

func (r *renderer) renderGRPC() []byte {
	i := r.draw.next()
	r.drawn = append(r.drawn[:0], i)
	var v [maxValueLen]byte
	r.buf = appendGRPCRequest(r.buf[:0], r.domain, r.key, appendValue(v[:0], r.draw.dist, i))
	return r.buf
}

// sent counts the values of the last request rendered as sent.
func (r *renderer) sent() {
	for _, i := range r.drawn {
		r.keys.add(i)
	}
}

// appendGRPCRequest appends what GRPCRequest returns for one check of value
// in domain and key, a RateLimitRequest as a gRPC message, encoded by hand:
// the 5-byte prefix, then domain (field 1; omitted when empty, as proto3
// does), one descriptor (2) of one entry (1: key 1, value 2), and
// hits_addend 1 (3), in field order as proto.Marshal writes them.
func appendGRPCRequest(b []byte, domain, key string, value []byte) []byte {
	str := func(n int) int { // a non-empty string field's size
		if n == 0 {
			return 0
		}
		return 1 + protowire.SizeBytes(n)
	}
	entry := str(len(key)) + str(len(value))
	desc := 1 + protowire.SizeBytes(entry)
	msg := str(len(domain)) + 1 + protowire.SizeBytes(desc) + 1 + protowire.SizeVarint(1)
	b = binary.BigEndian.AppendUint32(append(b, 0), uint32(msg))
	if domain != "" {
		b = protowire.AppendString(protowire.AppendTag(b, 1, protowire.BytesType), domain)
	}
	b = protowire.AppendVarint(protowire.AppendTag(b, 2, protowire.BytesType), uint64(desc))
	b = protowire.AppendVarint(protowire.AppendTag(b, 1, protowire.BytesType), uint64(entry))
	if key != "" {
		b = protowire.AppendString(protowire.AppendTag(b, 1, protowire.BytesType), key)
	}
	if len(value) > 0 {
		b = protowire.AppendBytes(protowire.AppendTag(b, 2, protowire.BytesType), value)
	}
	return protowire.AppendVarint(protowire.AppendTag(b, 3, protowire.VarintType), 1)
}
