package origproto

import (
	"bytes"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"time"
)

// GuardListener returns a listener whose connections check the framing of
// every request before net/http reads it. net/http reconciles ambiguous
// framing itself (it drops Content-Length when Transfer-Encoding is
// present, and joins folded header lines), so a front end that framed the
// same bytes differently could smuggle a request past it; the guard sees
// the raw bytes and refuses such a request instead.
//
// On HTTP/1, each request head on a connection (keep-alive and pipelined
// ones too) is refused with 400 and the connection closed when it has
// both Content-Length and Transfer-Encoding, a Transfer-Encoding other
// than exactly "chunked" (or any on HTTP/1.0), Content-Length values that
// are not one plain decimal number, an obs-fold continuation line, a bare
// LF or CR, a header name that is not a token, or a malformed request
// line (RFC 9112 sections 2.2, 3, 5.2, 6.1 and 6.3). Requests answered
// before it on the same connection are answered as usual. A chunked body
// that breaks its framing ends the connection. A request that asks for an
// Upgrade, and a CONNECT, reach net/http marked "Connection: close", and
// the bytes after them are not checked: they belong to the upgraded
// protocol, or, if the upgrade is declined, the connection ends after the
// response. A handler that hijacks other requests should not be served
// through the guard.
//
// An HTTP/2 connection with prior knowledge passes untouched, but its
// header blocks are watched: one that is not finished within the read
// header timeout (10s, or the server's ReadHeaderTimeout under
// [NewServer]), or that is split into more than 32 CONTINUATION frames,
// closes the connection.
//
// Wrap a plain TCP listener: net/http recognises TLS connections by their
// type, which the guard hides. [NewServer]'s servers expect to be served on
// a guarded listener.
func GuardListener(ln net.Listener) net.Listener { return &guardListener{ln} }

type guardListener struct{ net.Listener }

func (l *guardListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &guardConn{Conn: c, headerTimeout: defaultHeaderTimeout}, nil
}

const (
	defaultHeaderTimeout = 10 * time.Second
	// maxHeadBytes bounds a request head the guard holds while it checks
	// it: NewServer's MaxHeaderBytes plus net/http's slack.
	maxHeadBytes     = 64<<10 + 4096
	maxChunkLine     = 4096
	maxTrailerBytes  = 64 << 10
	maxContinuations = 32
	guardBufSize     = 4096
)

// refusedLine replaces a refused request head: net/http cannot parse it as
// a request line, so it answers 400 with Connection: close and reads no
// further. The guard then reports the end of the connection.
const refusedLine = "ambiguous-request-framing-refused\r\n\r\n"

const h2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

var (
	errBadChunked     = errors.New("malformed chunked request body")
	errContinuations  = errors.New("origproto: too many HTTP/2 CONTINUATION frames")
	connectionClose   = []byte("Connection: close\r\n")
	headerEnd         = []byte("\r\n\r\n")
	nameContentLength = []byte("content-length")
	nameTE            = []byte("transfer-encoding")
	nameUpgrade       = []byte("upgrade")
)

type guardState uint8

const (
	stStart   guardState = iota // nothing read yet: HTTP/1 or the HTTP/2 preface
	stHead                      // reading a request head
	stBody                      // a Content-Length body: remain bytes
	stChunk                     // a chunked body
	stPass                      // after an upgrade: bytes pass unchecked
	stH2                        // HTTP/2 with prior knowledge: frames watched
	stRefused                   // the refused line was queued; then EOF
	stFailed                    // deliver what was approved, then fail
)

// guardConn checks the bytes read from the network before handing them on.
// buf[r:p] has been checked and is handed on by Read; buf[p:w] is read but
// not yet checked (a request head is held here until it is complete).
type guardConn struct {
	net.Conn
	headerTimeout time.Duration

	buf     []byte
	r, p, w int
	state   guardState

	remain int64 // stBody: body bytes left; stChunk: chunk data bytes left
	scan   int   // stHead: bytes of buf[p:w] already scanned for LFs
	chunk  chunkParser

	h2 h2Watch
}

func (c *guardConn) Read(b []byte) (int, error) {
	for {
		if c.r < c.p {
			n := copy(b, c.buf[c.r:c.p])
			c.r += n
			if c.r == c.w {
				c.r, c.p, c.w = 0, 0, 0
				if len(c.buf) > guardBufSize {
					c.buf = nil // a large head is done: keep no more than a small buffer
				}
			}
			return n, nil
		}
		switch c.state {
		case stRefused:
			return 0, io.EOF // net/http answers the refused line and closes
		case stFailed:
			// The connection ends here: net/http fails the body read (an
			// unexpected EOF), answers the handler's response and closes.
			return 0, io.EOF
		case stPass, stH2:
			if c.w > c.p { // left over from the head or preface
				if c.state == stH2 {
					if err := c.h2.scan(c, c.buf[c.p:c.w]); err != nil {
						c.Conn.Close()
						return 0, err
					}
				}
				c.p = c.w
				continue
			}
			c.buf = nil // no longer needed: read straight into b
			n, err := c.Conn.Read(b)
			if c.state == stH2 && n > 0 {
				if serr := c.h2.scan(c, b[:n]); serr != nil {
					c.Conn.Close()
					return 0, serr
				}
			}
			return n, err
		}
		if c.advance() {
			continue
		}
		if err := c.fill(); err != nil {
			if c.r < c.p {
				continue // hand on what was checked; the error comes again
			}
			return 0, err
		}
	}
}

// fill reads more bytes from the network into buf[w:].
func (c *guardConn) fill() error {
	if c.buf == nil {
		c.buf = make([]byte, guardBufSize)
	}
	if c.r > 0 && c.w == len(c.buf) {
		n := copy(c.buf, c.buf[c.r:c.w])
		c.p -= c.r
		c.w = n
		c.r = 0
	}
	if c.w == len(c.buf) {
		// Only a head being held fills the buffer; grow it up to the
		// head limit (advance refuses anything longer).
		nb := make([]byte, min(2*len(c.buf), maxHeadBytes+guardBufSize))
		copy(nb, c.buf[:c.w])
		c.buf = nb
	}
	n, err := c.Conn.Read(c.buf[c.w:])
	c.w += n
	if n > 0 {
		return nil
	}
	return err
}

// advance checks as much of buf[p:w] as it can and reports whether it made
// progress (or changed state).
func (c *guardConn) advance() bool {
	if c.p == c.w {
		return false
	}
	switch c.state {
	case stStart:
		avail := c.buf[c.p:c.w]
		if len(avail) < len(h2Preface) && bytes.HasPrefix([]byte(h2Preface), avail) {
			return false
		}
		if bytes.HasPrefix(avail, []byte(h2Preface)) {
			c.state = stH2
			c.p += len(h2Preface)
			return true
		}
		c.state = stHead
		return true
	case stHead:
		return c.head()
	case stBody:
		n := int64(c.w - c.p)
		if n > c.remain {
			n = c.remain
		}
		c.p += int(n)
		c.remain -= n
		if c.remain == 0 {
			c.state = stHead
		}
		return true
	case stChunk:
		p, done, err := c.chunk.parse(c.buf[c.p:c.w])
		c.p += p
		if err != nil {
			c.state = stFailed
			c.w = c.p
			return true
		}
		if done {
			c.state = stHead
		}
		return p > 0 || done
	}
	return false
}

// head checks the request head at buf[p:], once it is complete.
func (c *guardConn) head() bool {
	// RFC 9112 section 2.2: empty lines before a request line are ignored.
	for c.w-c.p >= 2 && c.scan == 0 && c.buf[c.p] == '\r' && c.buf[c.p+1] == '\n' {
		c.p += 2
		return true
	}
	h := c.buf[c.p:c.w]
	end := -1
	for c.scan < len(h) {
		i := bytes.IndexByte(h[c.scan:], '\n')
		if i < 0 {
			c.scan = len(h)
			break
		}
		i += c.scan
		if i == 0 || h[i-1] != '\r' {
			return c.refuse() // bare LF
		}
		c.scan = i + 1
		if i >= 3 && h[i-3] == '\r' && h[i-2] == '\n' {
			end = i + 1
			break
		}
	}
	if end < 0 {
		if len(h) > maxHeadBytes {
			return c.refuse()
		}
		return false
	}
	c.scan = 0
	f, ok := checkHead(h[:end])
	if !ok {
		return c.refuse()
	}
	if f.upgrade {
		// Insert Connection: close before the final CRLF, so that a
		// declined upgrade ends the connection.
		c.insert(c.p+end-2, connectionClose)
		end += len(connectionClose)
		c.p += end
		c.state = stPass
		return true
	}
	c.p += end
	switch {
	case f.chunked:
		c.state = stChunk
		c.chunk = chunkParser{}
	case f.length > 0:
		c.state, c.remain = stBody, f.length
	}
	return true
}

// refuse drops everything from the refused head on and queues the line
// net/http answers with 400.
func (c *guardConn) refuse() bool {
	c.w = c.p
	c.insert(c.p, []byte(refusedLine))
	c.p = c.w
	c.state = stRefused
	return true
}

// insert puts s into buf at i, shifting buf[i:w] right.
func (c *guardConn) insert(i int, s []byte) {
	if c.w+len(s) > len(c.buf) {
		nb := make([]byte, c.w+len(s)+guardBufSize)
		copy(nb, c.buf[:c.w])
		c.buf = nb
	}
	copy(c.buf[i+len(s):], c.buf[i:c.w])
	copy(c.buf[i:], s)
	c.w += len(s)
}

// framing is what a request head says about its body.
type framing struct {
	length  int64
	chunked bool
	upgrade bool
}

// checkHead checks a complete request head (ending in CRLF CRLF, with no
// bare LF) and returns its body framing.
func checkHead(h []byte) (framing, bool) {
	var f framing
	if bytes.IndexByte(h, 0) >= 0 {
		return f, false
	}
	i := bytes.Index(h, headerEnd[:2])
	line, rest := h[:i], h[i+2:]
	// Request line: method SP request-target SP HTTP-version.
	sp1 := bytes.IndexByte(line, ' ')
	sp2 := bytes.LastIndexByte(line, ' ')
	if sp1 <= 0 || sp2 == sp1 || bytes.IndexByte(line[sp1+1:sp2], ' ') >= 0 || sp2 == sp1+1 {
		return f, false
	}
	method, version := line[:sp1], line[sp2+1:]
	if !isToken(method) || bytes.IndexByte(line, '\r') >= 0 || bytes.IndexByte(line, '\t') >= 0 {
		return f, false
	}
	if len(version) != 8 || string(version[:7]) != "HTTP/1." || version[7] < '0' || version[7] > '9' {
		return f, false
	}
	http10 := version[7] == '0'
	f.upgrade = string(method) == "CONNECT"
	haveLength := false
	haveTE := false
	for len(rest) > 2 {
		i := bytes.Index(rest, headerEnd[:2])
		line, rest = rest[:i], rest[i+2:]
		if line[0] == ' ' || line[0] == '\t' {
			return f, false // obs-fold
		}
		if bytes.IndexByte(line, '\r') >= 0 {
			return f, false // bare CR
		}
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 || !isToken(line[:colon]) {
			return f, false
		}
		name, value := line[:colon], trimOWS(line[colon+1:])
		switch {
		case bytes.EqualFold(name, nameContentLength):
			n, ok := parseLength(value)
			if !ok || haveLength && n != f.length {
				return f, false
			}
			haveLength, f.length = true, n
		case bytes.EqualFold(name, nameTE):
			if haveTE || http10 || !bytes.EqualFold(value, []byte("chunked")) {
				return f, false
			}
			haveTE, f.chunked = true, true
		case bytes.EqualFold(name, nameUpgrade):
			f.upgrade = true
		}
	}
	if haveTE && haveLength {
		return f, false
	}
	return f, true
}

func parseLength(v []byte) (int64, bool) {
	if len(v) == 0 || len(v) > 18 {
		return 0, false
	}
	var n int64
	for _, b := range v {
		if b < '0' || b > '9' {
			return 0, false
		}
		n = n*10 + int64(b-'0')
	}
	return n, true
}

func trimOWS(v []byte) []byte {
	for len(v) > 0 && (v[0] == ' ' || v[0] == '\t') {
		v = v[1:]
	}
	for len(v) > 0 && (v[len(v)-1] == ' ' || v[len(v)-1] == '\t') {
		v = v[:len(v)-1]
	}
	return v
}

// tokenChars are the bytes of an RFC 9110 token.
var tokenChars = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c], t[c-'a'+'A'] = true, true
	}
	for _, c := range "!#$%&'*+-.^_`|~" {
		t[c] = true
	}
	return t
}()

func isTokenString(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !tokenChars[s[i]] {
			return false
		}
	}
	return true
}

func isToken(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for _, c := range b {
		if !tokenChars[c] {
			return false
		}
	}
	return true
}

// chunkParser follows a chunked body (RFC 9112 section 7.1) to its end.
type chunkParser struct {
	st      uint8
	size    int64
	digits  int
	line    int // bytes of the current size or trailer line
	trailer int // trailer section bytes
}

const (
	chSize    = iota // chunk-size digits
	chExt            // after the size: extensions up to CR
	chSizeLF         // LF after the size line
	chData           // chunk data
	chDataCR         // CR after the data
	chDataLF         // LF after the data
	chTrailer        // a trailer line (or the final empty line)
	chTrailerLF
)

// parse consumes b and returns how many bytes belong to the body, whether
// the body ended there, or an error at the first byte that breaks it.
func (p *chunkParser) parse(b []byte) (int, bool, error) {
	i := 0
	for i < len(b) {
		c := b[i]
		switch p.st {
		case chSize:
			if v, ok := unhex(c); ok {
				if p.digits == 16 {
					return i, false, errBadChunked
				}
				p.size = p.size<<4 | int64(v)
				p.digits++
				if p.size < 0 {
					return i, false, errBadChunked
				}
				i++
				continue
			}
			if p.digits == 0 {
				return i, false, errBadChunked
			}
			p.st = chExt
			continue
		case chExt:
			if c == '\r' {
				p.st = chSizeLF
			} else if c == '\n' || c == 0 {
				return i, false, errBadChunked
			}
			p.line++
			if p.line > maxChunkLine {
				return i, false, errBadChunked
			}
		case chSizeLF:
			if c != '\n' {
				return i, false, errBadChunked
			}
			p.line, p.digits = 0, 0
			if p.size == 0 {
				p.st = chTrailer
			} else {
				p.st = chData
			}
		case chData:
			n := int64(len(b) - i)
			if n > p.size {
				n = p.size
			}
			p.size -= n
			i += int(n)
			if p.size == 0 {
				p.st = chDataCR
			}
			continue
		case chDataCR:
			if c != '\r' {
				return i, false, errBadChunked
			}
			p.st = chDataLF
		case chDataLF:
			if c != '\n' {
				return i, false, errBadChunked
			}
			p.st = chSize
		case chTrailer:
			switch {
			case c == '\r':
				p.st = chTrailerLF
			case c == '\n' || c == 0, p.line == 0 && (c == ' ' || c == '\t'):
				return i, false, errBadChunked // bare LF, NUL, obs-fold
			}
			p.line++
			p.trailer++
			if p.trailer > maxTrailerBytes {
				return i, false, errBadChunked
			}
		case chTrailerLF:
			if c != '\n' {
				return i, false, errBadChunked
			}
			if p.line == 1 { // the empty line: the end
				return i + 1, true, nil
			}
			p.line = 0
			p.st = chTrailer
		}
		i++
	}
	return i, false, nil
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// h2Watch follows the frames of an HTTP/2 connection for its header
// blocks.
type h2Watch struct {
	hdr     [9]byte
	hdrN    int
	remain  int  // payload bytes of the current frame still to come
	ends    bool // the current frame ends a header block
	inBlock bool
	conts   int
	timer   atomic.Pointer[time.Timer] // Close stops it from another goroutine
}

const (
	frameHeaders      = 0x1
	framePushPromise  = 0x5
	frameContinuation = 0x9
	flagEndHeaders    = 0x4
)

func (h *h2Watch) scan(c *guardConn, b []byte) error {
	for len(b) > 0 {
		if h.remain > 0 {
			n := min(h.remain, len(b))
			h.remain -= n
			b = b[n:]
			if h.remain == 0 && h.ends {
				h.endBlock()
			}
			continue
		}
		n := copy(h.hdr[h.hdrN:], b)
		h.hdrN += n
		b = b[n:]
		if h.hdrN < len(h.hdr) {
			return nil
		}
		h.hdrN = 0
		length := int(h.hdr[0])<<16 | int(h.hdr[1])<<8 | int(h.hdr[2])
		typ, flags := h.hdr[3], h.hdr[4]
		h.remain, h.ends = length, false
		switch typ {
		case frameHeaders, framePushPromise:
			h.inBlock, h.conts = true, 0
			h.startTimer(c)
			h.ends = flags&flagEndHeaders != 0
		case frameContinuation:
			if h.inBlock {
				h.conts++
				if h.conts > maxContinuations {
					return errContinuations
				}
				h.ends = flags&flagEndHeaders != 0
			}
		}
		if h.remain == 0 && h.ends {
			h.endBlock()
		}
	}
	return nil
}

func (h *h2Watch) startTimer(c *guardConn) {
	if t := h.timer.Load(); t != nil {
		t.Reset(c.headerTimeout)
		return
	}
	h.timer.Store(time.AfterFunc(c.headerTimeout, func() { c.Conn.Close() }))
}

func (h *h2Watch) endBlock() {
	h.inBlock = false
	if t := h.timer.Load(); t != nil {
		t.Stop()
	}
}

// Close stops the header-block timer with the connection.
func (c *guardConn) Close() error {
	if t := c.h2.timer.Load(); t != nil {
		t.Stop()
	}
	return c.Conn.Close()
}
