package loadgen

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
)

// errTruncated is returned when the connection ends inside a response.
var errTruncated = errors.New("loadgen: connection closed mid-response")

// readResponse reads one HTTP/1.1 response from br and discards its body.
// It returns the status code and whether the connection must be closed
// afterwards (Connection: close, HTTP/1.0 without keep-alive, or a body
// delimited by the end of the connection). Interim 1xx responses are skipped.
// Only Content-Length, Transfer-Encoding: chunked and Connection are
// interpreted. It does not allocate unless it returns an error.
func readResponse(br *bufio.Reader) (int, bool, error) {
	for {
		line, err := readLine(br)
		if err != nil {
			return 0, false, err
		}
		status, http10, err := parseStatusLine(line)
		if err != nil {
			return 0, false, err
		}
		clen, chunked, closeConn := int64(-1), false, http10
		for {
			line, err := readLine(br)
			if err != nil {
				return 0, false, eofIsTruncation(err)
			}
			if len(line) == 0 {
				break
			}
			colon := bytes.IndexByte(line, ':')
			if colon <= 0 {
				return 0, false, fmt.Errorf("loadgen: malformed header line %q", line)
			}
			name, val := line[:colon], trimSpace(line[colon+1:])
			switch {
			case equalFold(name, "content-length"):
				n, ok := parseUint(val, 10)
				if !ok || (clen >= 0 && n != clen) {
					return 0, false, fmt.Errorf("loadgen: bad Content-Length %q", val)
				}
				clen = n
			case equalFold(name, "transfer-encoding"):
				chunked = hasToken(val, "chunked")
			case equalFold(name, "connection"):
				if hasToken(val, "close") {
					closeConn = true
				} else if hasToken(val, "keep-alive") {
					closeConn = false
				}
			}
		}
		switch {
		case status < 200:
			continue // interim response: no body, the real one follows
		case status == 204 || status == 304:
		case chunked:
			err = discardChunked(br)
		case clen >= 0:
			err = discard(br, clen)
		default: // body runs to the end of the connection
			for err == nil {
				_, err = br.Discard(br.Size())
			}
			if err == io.EOF {
				err = nil
			}
			closeConn = true
		}
		if err != nil {
			return 0, false, err
		}
		return status, closeConn, nil
	}
}

// parseStatusLine parses "HTTP/1.x NNN reason".
func parseStatusLine(line []byte) (status int, http10 bool, err error) {
	if len(line) < 12 || string(line[:7]) != "HTTP/1." || line[8] != ' ' ||
		(line[7] != '0' && line[7] != '1') || (len(line) > 12 && line[12] != ' ') {
		return 0, false, fmt.Errorf("loadgen: malformed status line %q", line)
	}
	for _, c := range line[9:12] {
		if c < '0' || c > '9' {
			return 0, false, fmt.Errorf("loadgen: malformed status line %q", line)
		}
		status = status*10 + int(c-'0')
	}
	if status < 100 {
		return 0, false, fmt.Errorf("loadgen: malformed status line %q", line)
	}
	return status, line[7] == '0', nil
}

func discardChunked(br *bufio.Reader) error {
	for {
		line, err := readLine(br)
		if err != nil {
			return eofIsTruncation(err)
		}
		if i := bytes.IndexByte(line, ';'); i >= 0 {
			line = line[:i] // chunk extension
		}
		n, ok := parseUint(trimSpace(line), 16)
		if !ok {
			return fmt.Errorf("loadgen: bad chunk size %q", line)
		}
		if n == 0 {
			for { // trailer section up to the blank line
				line, err := readLine(br)
				if err != nil {
					return eofIsTruncation(err)
				}
				if len(line) == 0 {
					return nil
				}
			}
		}
		if err := discard(br, n); err != nil {
			return err
		}
		line, err = readLine(br)
		if err != nil {
			return eofIsTruncation(err)
		}
		if len(line) != 0 {
			return fmt.Errorf("loadgen: missing CRLF after chunk, got %q", line)
		}
	}
}

func discard(br *bufio.Reader, n int64) error {
	for n > 0 {
		step := int(min(n, 1<<30))
		d, err := br.Discard(step)
		n -= int64(d)
		if err != nil {
			return eofIsTruncation(err)
		}
	}
	return nil
}

// readLine returns the next line without its CRLF (or LF). The slice is only
// valid until the next read from br. A line longer than br's buffer is an
// error; a clean end of stream before any byte is io.EOF.
func readLine(br *bufio.Reader) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	switch {
	case err == bufio.ErrBufferFull:
		return nil, fmt.Errorf("loadgen: response line longer than %d bytes", br.Size())
	case err == io.EOF && len(line) > 0:
		return nil, errTruncated
	case err != nil:
		return nil, err
	}
	line = line[:len(line)-1]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	return line, nil
}

func eofIsTruncation(err error) error {
	if err == io.EOF {
		return errTruncated
	}
	return err
}

// parseUint parses a non-empty unsigned number in base 10 or 16, rejecting
// values that do not fit in 60 bits.
func parseUint(b []byte, base int64) (int64, bool) {
	if len(b) == 0 {
		return 0, false
	}
	var n int64
	for _, c := range b {
		var d int64
		switch {
		case c >= '0' && c <= '9':
			d = int64(c - '0')
		case base == 16 && c|0x20 >= 'a' && c|0x20 <= 'f':
			d = int64(c|0x20-'a') + 10
		default:
			return 0, false
		}
		n = n*base + d
		if n >= 1<<60 {
			return 0, false
		}
	}
	return n, true
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

// equalFold reports whether b equals the lower-case ASCII string s, ignoring case.
func equalFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range b {
		c := b[i]
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != s[i] {
			return false
		}
	}
	return true
}

// hasToken reports whether the comma-separated list v contains token (lower-case).
func hasToken(v []byte, token string) bool {
	for len(v) > 0 {
		i := bytes.IndexByte(v, ',')
		if i < 0 {
			i = len(v)
		}
		if equalFold(trimSpace(v[:i]), token) {
			return true
		}
		v = v[min(i+1, len(v)):]
	}
	return false
}
