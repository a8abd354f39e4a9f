package strong

// RTT estimates the round trip to one home and how long to wait for its
// reply, as TCP's retransmission timer does (RFC 6298): SRTT is the
// smoothed round trip (gain 1/8), RTTVAR its smoothed mean deviation (gain
// 1/4), and a reply later than SRTT + 4·RTTVAR is taken as lost. The
// timeout is never below Floor, which covers what the round trip does not
// measure: a busy home's scheduling and a garbage collection pause. Before
// the first sample it is Initial (or Floor when larger).
//
// A home that did not answer is left alone for a while (Lost): the checks
// made meanwhile do not wait for it, and are decided at once by the
// partition policy. The pause is the timeout, doubled at each loss in a
// row up to MaxBackoff (RFC 6298 5.5), and ends at the first reply.
//
// The zero value has no samples and a zero Floor and Initial. Not safe for
// concurrent use.
type RTT struct {
	// Floor is the least timeout, ns.
	Floor int64
	// Initial is the timeout before any round trip was measured, ns.
	Initial int64
	// MaxBackoff bounds the pause after losses in a row, ns; 0 means no
	// bound but the timeout's.
	MaxBackoff int64

	srtt, rttvar int64
	measured     bool
	backoff      int64 // the last pause; 0 after a reply
	downUntil    int64 // no request before then, unix ns
}

// Ask reports whether a check at now should ask the home, and how long to
// wait for it: false while the home is left alone after a loss.
func (r *RTT) Ask(now int64) (timeout int64, ok bool) {
	if now < r.downUntil {
		return 0, false
	}
	return r.Timeout(), true
}

// Lost records at now that a request got no reply within its timeout.
func (r *RTT) Lost(now int64) {
	r.backoff = max(2*r.backoff, r.Timeout())
	if r.MaxBackoff > 0 {
		r.backoff = min(r.backoff, r.MaxBackoff)
	}
	r.downUntil = now + r.backoff
}

// Observe takes one measured round trip, ns: the time from sending a
// request to applying its reply. Negative samples are ignored.
func (r *RTT) Observe(sample int64) {
	if sample < 0 {
		return
	}
	r.backoff, r.downUntil = 0, 0
	if !r.measured {
		r.srtt, r.rttvar, r.measured = sample, sample/2, true
		return
	}
	d := r.srtt - sample
	if d < 0 {
		d = -d
	}
	r.rttvar += (d - r.rttvar) / 4
	r.srtt += (sample - r.srtt) / 8
}

// Timeout is how long to wait for a reply before the home counts as
// unreachable, ns.
func (r *RTT) Timeout() int64 {
	if !r.measured {
		return max(r.Initial, r.Floor)
	}
	return max(r.srtt+4*r.rttvar, r.Floor)
}

// Smoothed returns the smoothed round trip and its deviation, ns, and
// whether any sample was taken.
func (r *RTT) Smoothed() (srtt, rttvar int64, ok bool) { return r.srtt, r.rttvar, r.measured }
