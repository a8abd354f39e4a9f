package loadgen

import (
	"encoding/json"
	"math/rand/v2"
	"strconv"
)

// Ring sizing: up to ringMax pre-rendered requests per worker, halved until
// all workers' rings together fit in ringBudget bytes.
const (
	ringMax    = 4096
	ringBudget = 32 << 20
)

// renderRing pre-renders the requests worker idx will cycle through: complete
// HTTP/1.1 requests whose descriptor values follow the distribution, drawn
// from a generator seeded with Seed+idx. The returned slices share one buffer.
func renderRing(t *target, idx int) [][]byte {
	c := &t.cfg
	next := values(c, idx)
	domain, _ := json.Marshal(c.Domain) // strings always marshal
	key, _ := json.Marshal(c.Key)
	checks := max(c.Batch, 1)
	head := "POST " + t.path + " HTTP/1.1\r\nHost: " + t.host +
		"\r\nContent-Type: application/json\r\nContent-Length: "

	n := ringMax
	if c.Dist == HotKey {
		n = 1 // every request is identical
	}
	est := len(head) + 16 + checks*(len(domain)+len(key)+80)
	for n > 1 && n*est*c.Concurrency > ringBudget {
		n /= 2
	}

	buf := make([]byte, 0, n*est)
	offs := make([]int, 0, n+1)
	var body []byte
	for range n {
		body = body[:0]
		if c.Batch > 0 {
			body = append(body, `{"checks":[`...)
		}
		for k := range checks {
			if k > 0 {
				body = append(body, ',')
			}
			body = append(body, `{"domain":`...)
			body = append(body, domain...)
			body = append(body, `,"descriptors":[{"entries":[{"key":`...)
			body = append(body, key...)
			body = append(body, `,"value":"`...)
			body = next(body)
			body = append(body, `"}]}],"hits_addend":1}`...)
		}
		if c.Batch > 0 {
			body = append(body, "]}"...)
		}
		offs = append(offs, len(buf))
		buf = append(buf, head...)
		buf = strconv.AppendInt(buf, int64(len(body)), 10)
		buf = append(buf, "\r\n\r\n"...)
		buf = append(buf, body...)
	}
	offs = append(offs, len(buf))
	ring := make([][]byte, n)
	for i := range ring {
		ring[i] = buf[offs[i]:offs[i+1]:offs[i+1]]
	}
	return ring
}

// values returns the generator of worker idx's descriptor values: it appends
// the next value to b — "hot", or "k" and a number drawn from the
// distribution by a generator seeded with Seed+idx.
func values(c *Config, idx int) func(b []byte) []byte {
	rng := rand.New(rand.NewPCG(c.Seed+uint64(idx), 0x9e3779b97f4a7c15))
	var zipf *rand.Zipf
	if c.Dist == Zipf {
		zipf = rand.NewZipf(rng, c.ZipfS, 1, uint64(c.Keys-1))
	}
	return func(b []byte) []byte {
		switch c.Dist {
		case Uniform:
			return strconv.AppendInt(append(b, 'k'), int64(rng.IntN(c.Keys)), 10)
		case Zipf:
			return strconv.AppendUint(append(b, 'k'), zipf.Uint64(), 10)
		}
		return append(b, "hot"...)
	}
}
