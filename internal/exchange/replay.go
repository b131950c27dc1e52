package exchange

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
)

// replayBody is the request body of a retryable request. The first attempt
// reads through it, so the body is forwarded as it arrives and never
// waited for, while a copy of up to MaxRetryBodyBytes is kept. Once the
// first attempt has read the whole body within the cap (to EOF, or to its
// declared length), every retry sends the copy: the same bytes, each once.
// A body still arriving, larger than the cap, or cut short cannot be
// replayed, so a retry never starts before the body was read and never
// sends a chunk the first attempt had not finished with.
type replayBody struct {
	src   io.ReadCloser
	want  int64 // the declared length; <= 0 when unknown
	limit int   // the largest copy kept

	mu       sync.Mutex
	buf      []byte
	complete bool // the whole body is in buf; sticky, and buf is then frozen
	spoiled  bool // more than the cap, a read error, closed early or released
}

// newReplayBody returns the body of a request's first attempt reading
// src, a body of declared length want (<= 0: unknown; at most
// MaxRetryBodyBytes).
func newReplayBody(src io.ReadCloser, want int64) *replayBody {
	return newReplayBodyLimit(src, want, MaxRetryBodyBytes)
}

// newReplayBodyLimit is newReplayBody keeping a copy of up to limit bytes.
func newReplayBodyLimit(src io.ReadCloser, want int64, limit int) *replayBody {
	return &replayBody{src: src, want: want, limit: limit}
}

// Read reads the source for the first attempt, keeping a copy.
func (b *replayBody) Read(p []byte) (int, error) {
	n, err := b.src.Read(p)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.complete || b.spoiled {
		// Bytes past a declared length make the first attempt fail; a copy
		// already complete stays what the upstream could have seen.
		return n, err
	}
	if len(b.buf)+n > b.limit {
		b.spoil()
		return n, err
	}
	b.buf = append(b.buf, p[:n]...)
	switch {
	case err == io.EOF, err == nil && b.want > 0 && int64(len(b.buf)) == b.want:
		b.complete = true
	case err != nil:
		b.spoil()
	}
	return n, err
}

// Close closes the source; a body closed before it was read whole cannot
// be replayed.
func (b *replayBody) Close() error {
	b.mu.Lock()
	if !b.complete {
		b.spoil()
	}
	b.mu.Unlock()
	return b.src.Close()
}

// spoil drops the copy; b.mu is held.
func (b *replayBody) spoil() {
	b.spoiled, b.buf = true, nil
}

// replayable reports whether a retry can send the body; a nil b (a request
// without a body) always can.
func (b *replayBody) replayable() bool {
	if b == nil {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.complete
}

// replay returns a fresh copy of the body for a retry. It is only called
// once replayable reported true.
func (b *replayBody) replay() (io.ReadCloser, error) {
	b.mu.Lock()
	data := b.buf
	b.mu.Unlock()
	if len(data) == 0 {
		return http.NoBody, nil
	}
	return io.NopCloser(bytes.NewReader(data)), nil
}

// release drops the copy of a body whose request will not be retried
// again (its response went to the caller), so that a long request stream
// keeps no buffer.
func (b *replayBody) release() {
	if b == nil {
		return
	}
	b.mu.Lock()
	b.complete = false
	b.spoil()
	b.mu.Unlock()
}

// abortBody is a request body whose reads give up when its context ends.
// Go's HTTP/1 transport waits for a pending body read before it returns
// from a cancelled request, so a body that streams slowly would hold the
// route timeout's 504 back for as long as it stays silent. The source is
// read by a goroutine of the body's own into a buffer of its own; a read
// abandoned at the context's end leaves that goroutine to finish the
// source's read and close the source.
type abortBody struct {
	src  io.ReadCloser
	ctx  context.Context
	want chan struct{} // asks the reader goroutine for a chunk
	got  chan chunk    // its answers
	quit chan struct{} // closed by Close

	rest []byte
	err  error // sticky: the source's error or the context's

	mu              sync.Mutex
	started, closed bool // the reader goroutine was started; Close was called
}

type chunk struct {
	data []byte
	err  error
}

// abortChunk is the reader goroutine's buffer size.
const abortChunk = 32 << 10

func newAbortBody(ctx context.Context, src io.ReadCloser) *abortBody {
	return &abortBody{src: src, ctx: ctx, want: make(chan struct{}, 1), got: make(chan chunk, 1), quit: make(chan struct{})}
}

// Read is called by one goroutine at a time, as an io.Reader is.
func (b *abortBody) Read(p []byte) (int, error) {
	if len(b.rest) > 0 {
		n := copy(p, b.rest)
		b.rest = b.rest[n:]
		return n, nil
	}
	if b.err != nil {
		return 0, b.err
	}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return 0, errBodyClosed
	}
	if !b.started {
		b.started = true
		go b.pump()
	}
	b.mu.Unlock()
	b.want <- struct{}{}
	select {
	case c := <-b.got:
		n := copy(p, c.data)
		b.rest = c.data[n:]
		if c.err != nil {
			b.err = c.err
			if len(b.rest) > 0 {
				return n, nil
			}
		}
		return n, c.err
	case <-b.ctx.Done():
		b.err = context.Cause(b.ctx)
		return 0, b.err
	case <-b.quit:
		// Closed while this read waited: HTTP/2's transport closes a
		// request body it stops sending (the response ended first) and
		// then waits for the read under way to return.
		b.err = errBodyClosed
		return 0, b.err
	}
}

// pump reads the source on request; it owns buf until it sends a chunk,
// and the chunk's data until the next request. It closes the source when
// it ends: at the source's end or error, the context's end, or Close.
func (b *abortBody) pump() {
	buf := make([]byte, abortChunk)
	defer b.src.Close()
	for {
		select {
		case <-b.want:
		case <-b.ctx.Done():
			return
		case <-b.quit:
			return
		}
		n, err := b.src.Read(buf)
		b.got <- chunk{buf[:n], err}
		if err != nil {
			return
		}
	}
}

// Close closes the source, at once when no read is under way, else when
// the reader goroutine's read returns: closing some sources (an HTTP/1
// server's request body) waits for a read in progress.
func (b *abortBody) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	if !b.started {
		return b.src.Close()
	}
	close(b.quit)
	return nil
}

var errBodyClosed = errors.New("profiles: read on a closed request body")
