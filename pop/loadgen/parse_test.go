package loadgen

import (
	"bufio"
	"io"
	"strings"
	"testing"
	"time"
)

func TestReadResponse(t *testing.T) {
	const next = "HTTP/1.1 204 No Content\r\n\r\n" // must remain parsable afterwards
	tests := []struct {
		name      string
		raw       string
		status    int
		closeConn bool
		eof       bool // the body runs to EOF, so nothing follows
	}{
		{"content-length", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 16\r\n\r\n{\"allowed\":true}", 200, false, false},
		{"denied", "HTTP/1.1 429 Too Many Requests\r\ncontent-length: 2\r\nRetry-After: 1\r\n\r\n{}", 429, false, false},
		{"lf-only", "HTTP/1.1 200 OK\nContent-Length: 2\n\nok", 200, false, false},
		{"no-reason", "HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n", 200, false, false},
		{"chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n1a;ext=1\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\n\r\n", 200, false, false},
		{"chunked-trailer", "HTTP/1.1 429 X\r\nTransfer-Encoding: Chunked\r\n\r\nA\r\n0123456789\r\n0\r\nX-Trailer: 1\r\n\r\n", 429, false, false},
		{"connection-close", "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", 200, true, false},
		{"connection-list", "HTTP/1.1 200 OK\r\nConnection: foo, Close\r\nContent-Length: 2\r\n\r\nok", 200, true, false},
		{"http10", "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", 200, true, false},
		{"http10-keepalive", "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok", 200, false, false},
		{"interim-100", "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", 200, false, false},
		{"no-content", "HTTP/1.1 204 No Content\r\n\r\n", 204, false, false},
		{"until-eof", "HTTP/1.1 200 OK\r\n\r\n" + strings.Repeat("x", 20000), 200, true, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			raw := tc.raw
			if !tc.eof {
				raw += next
			}
			br := bufio.NewReaderSize(strings.NewReader(raw), 64)
			status, closeConn, err := readResponse(br)
			if err != nil || status != tc.status || closeConn != tc.closeConn {
				t.Fatalf("got (%d, %v, %v), want (%d, %v, nil)", status, closeConn, err, tc.status, tc.closeConn)
			}
			if tc.eof {
				if _, err := br.ReadByte(); err != io.EOF {
					t.Fatalf("body not read to EOF: %v", err)
				}
				return
			}
			// The body must have been consumed exactly: the next response parses.
			if status, _, err := readResponse(br); err != nil || status != 204 {
				t.Fatalf("next response: (%d, %v), want (204, nil)", status, err)
			}
			if _, _, err := readResponse(br); err != io.EOF {
				t.Fatalf("at end: %v, want io.EOF", err)
			}
		})
	}
}

func TestReadResponseErrors(t *testing.T) {
	tests := map[string]string{
		"empty":             "",
		"garbage":           "hello world\r\n\r\n",
		"binary":            "\x00\x01\x02\xff\xfe\r\n",
		"http2":             "HTTP/2 200\r\n\r\n",
		"bad-status":        "HTTP/1.1 2x0 OK\r\n\r\n",
		"status-too-small":  "HTTP/1.1 099 OK\r\n\r\n",
		"no-space":          "HTTP/1.1 200OK\r\n\r\n",
		"bad-header":        "HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
		"bad-length":        "HTTP/1.1 200 OK\r\nContent-Length: 1x\r\n\r\n",
		"negative-length":   "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
		"huge-length":       "HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n",
		"conflicting":       "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
		"truncated-headers": "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n",
		"truncated-line":    "HTTP/1.1 200 OK\r\nContent-Len",
		"truncated-body":    "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc",
		"bad-chunk-size":    "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
		"chunk-no-crlf":     "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXY\r\n0\r\n\r\n",
		"truncated-chunk":   "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nabc",
		"no-last-chunk":     "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n",
		"line-too-long":     "HTTP/1.1 200 OK\r\nX-Big: " + strings.Repeat("a", 200) + "\r\n\r\n",
	}
	for name, raw := range tests {
		t.Run(name, func(t *testing.T) {
			br := bufio.NewReaderSize(strings.NewReader(raw), 64)
			if status, _, err := readResponse(br); err == nil {
				t.Fatalf("got status %d and no error", status)
			}
		})
	}
}

func TestReadResponseAllocs(t *testing.T) {
	for name, raw := range map[string]string{
		"content-length": respContentLength,
		"chunked":        respChunked,
	} {
		br := bufio.NewReaderSize(&loopReader{b: []byte(raw)}, readBufSize)
		allocs := testing.AllocsPerRun(1000, func() {
			if _, _, err := readResponse(br); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Errorf("%s: %v allocs per response, want 0", name, allocs)
		}
	}
}

func TestHistogram(t *testing.T) {
	for _, v := range []uint64{0, 1, 127, 128, 129, 255, 256, 1000, 123456, 1e9, 1<<histMaxBits - 1} {
		i := histIndex(v)
		if i < 0 || i >= histBuckets {
			t.Fatalf("histIndex(%d) = %d out of range", v, i)
		}
		if mid := float64(histMid(i)); v >= histSub && (mid < float64(v)*0.98 || mid > float64(v)*1.02) {
			t.Errorf("value %d: bucket %d midpoint %v off by more than 2%%", v, i, mid)
		}
	}
	var h histogram
	for i := 1; i <= 10000; i++ {
		h.record(time.Duration(i) * time.Microsecond)
	}
	for _, q := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 5 * time.Millisecond}, {0.99, 9900 * time.Microsecond}, {0.999, 9990 * time.Microsecond}} {
		got := h.quantile(q.q)
		if diff := float64(got-q.want) / float64(q.want); diff < -0.01 || diff > 0.01 {
			t.Errorf("quantile(%v) = %v, want %v ±1%%", q.q, got, q.want)
		}
	}
	h.record(time.Hour) // beyond the tracked range: top bucket, exact max
	if h.max != int64(time.Hour) || h.quantile(1) != time.Hour {
		t.Errorf("max = %v, quantile(1) = %v, want 1h", time.Duration(h.max), h.quantile(1))
	}
}

const (
	respContentLength = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Ratelimit-Limit: 100\r\nX-Ratelimit-Remaining: 42\r\nDate: Mon, 01 Jan 2024 00:00:00 GMT\r\nContent-Length: 43\r\n\r\n{\"allowed\":true,\"remaining\":42,\"limit\":100}"
	respChunked       = "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n10\r\n{\"allowed\":false\r\n3\r\n,\"x\r\n2\r\n\"}\r\n0\r\n\r\n"
)

// loopReader replays b forever.
type loopReader struct {
	b   []byte
	off int
}

func (r *loopReader) Read(p []byte) (int, error) {
	n := copy(p, r.b[r.off:])
	r.off = (r.off + n) % len(r.b)
	return n, nil
}

func BenchmarkReadResponse(b *testing.B) {
	for name, raw := range map[string]string{
		"content-length": respContentLength,
		"chunked":        respChunked,
	} {
		b.Run(name, func(b *testing.B) {
			br := bufio.NewReaderSize(&loopReader{b: []byte(raw)}, readBufSize)
			b.ReportAllocs()
			b.SetBytes(int64(len(raw)))
			for b.Loop() {
				if _, _, err := readResponse(br); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
