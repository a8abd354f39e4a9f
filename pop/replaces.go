package pop

import (
	"slices"

	"github.com/edgelimit/edgelimit/pop/rules"
)

// replaced returns the limits that the limits req matches replace (Envoy's
// replaces): such a limit does not apply to req, whichever descriptor matched
// it. It returns nil, without looking, when no limit of dom replaces another.
// The slice is s's memory, valid until s is reused.
func (e *Engine) replaced(dom *rules.Domain, req *Request, s *scratch) []*rules.Limit {
	s.replaced = s.replaced[:0]
	if dom == nil || !dom.HasReplaces() {
		return nil
	}
	for di := range req.Descriptors {
		d := &req.Descriptors[di]
		if d.Limit != nil { // a request's own limit replaces nothing
			continue
		}
		for _, l := range dom.Match(d.Entries) {
			for _, r := range l.Replaces {
				if !slices.Contains(s.replaced, r) {
					s.replaced = append(s.replaced, r)
				}
			}
		}
	}
	return s.replaced
}
