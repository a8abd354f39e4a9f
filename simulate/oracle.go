package simulate

// oracle is the exact sliding-window log over the hits admitted at all PoPs:
// at any instant t it knows the true number admitted in (t − window, t]. It
// grades each decision a strategy made and tracks overshoot. The zero value
// is not usable; use newOracle. An oracle is not safe for concurrent use.
//
// Decisions must be fed in non-decreasing time order.
type oracle struct {
	window, limit int64

	log   []hit // admitted hits in the window, oldest first, from head on
	head  int
	count int64 // sum of log[head:].n

	decisions, admitted   int64
	falseAllow, falseDeny int64
	worst                 int64 // max over time of count − limit (≥ 0)

	// Per fixed window [k·window, (k+1)·window): admitted hits, to report the
	// mean overshoot per window.
	fixedStart, fixedCount int64
	fixedExcess            int64 // Σ over closed windows of max(0, admitted − limit)
	fixedWindows           int64

	crossing, firstDeny int64 // virtual ns; -1 while not seen
}

type hit struct{ at, n int64 }

func newOracle(window, limit int64) *oracle {
	return &oracle{window: window, limit: limit, crossing: -1, firstDeny: -1}
}

// expire drops hits at or before now − window.
func (o *oracle) expire(now int64) {
	for o.head < len(o.log) && o.log[o.head].at <= now-o.window {
		o.count -= o.log[o.head].n
		o.head++
	}
	if o.head > 1024 && o.head*2 > len(o.log) { // compact
		n := copy(o.log, o.log[o.head:])
		o.log = o.log[:n]
		o.head = 0
	}
}

// roll closes the fixed windows that ended by now.
func (o *oracle) roll(now int64) {
	start := now - now%o.window
	if start == o.fixedStart {
		return
	}
	o.fixedExcess += max(o.fixedCount-o.limit, 0)
	o.fixedWindows++
	// Windows with no decision at all between fixedStart and start admitted nothing.
	o.fixedWindows += (start-o.fixedStart)/o.window - 1
	o.fixedStart, o.fixedCount = start, 0
}

// decide grades a decision of hits at now, admitted or not, and counts it.
func (o *oracle) decide(now, hits int64, admitted bool) {
	o.expire(now)
	o.roll(now)
	o.decisions++
	fits := o.count+hits <= o.limit
	if !fits && o.crossing < 0 {
		o.crossing = now
	}
	if !admitted {
		if fits {
			o.falseDeny++
		}
		if o.firstDeny < 0 {
			o.firstDeny = now
		}
		return
	}
	if !fits {
		o.falseAllow++
	}
	o.admitted += hits
	o.log = append(o.log, hit{now, hits})
	o.count += hits
	o.fixedCount += hits
	o.worst = max(o.worst, o.count-o.limit)
}

// finish closes the fixed windows up to end, the run's end (decisions come
// before end): a window the run covers only in part counts as a window.
func (o *oracle) finish(end int64) {
	o.roll((end + o.window - 1) / o.window * o.window)
}
