package topkeys

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// Collector exposes the sketch's n most limited keys as
// edgelimit_top_limited_keys{rank, key}: the count of each, since the PoP
// started. A scrape carries at most n series, so the metric's cardinality
// is bounded whatever keys clients send; describe turns a stored key into
// the text its label shows (nil: as stored).
func (s *Sketch) Collector(n int, describe func(string) string) prometheus.Collector {
	return &collector{s: s, n: n, describe: describe}
}

var topDesc = prometheus.NewDesc("edgelimit_top_limited_keys",
	"Denials per limited key, for the PoP's most limited keys since it started (a Space-Saving sketch of --top-keys keys; rank 1 is the most limited; the count may exceed the truth by up to the sketch's error).",
	[]string{"rank", "key"}, nil)

type collector struct {
	s        *Sketch
	n        int
	describe func(string) string
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) { ch <- topDesc }

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	for i, e := range c.s.Top(c.n) {
		key := e.Key
		if c.describe != nil {
			key = c.describe(key)
		}
		ch <- prometheus.MustNewConstMetric(topDesc, prometheus.GaugeValue, float64(e.Count), strconv.Itoa(i+1), key)
	}
}
