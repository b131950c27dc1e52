package exchange

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/inmesh/inmesh/classify"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestReplayBody(t *testing.T) {
	t.Run("read to EOF replays the same bytes", func(t *testing.T) {
		b := newReplayBody(io.NopCloser(strings.NewReader("hello")), -1)
		assert.False(t, b.replayable(), "nothing read yet")
		got, err := io.ReadAll(b)
		require.NoError(t, err)
		assert.Equal(t, "hello", string(got))
		require.True(t, b.replayable())
		for range 2 {
			r, err := b.replay()
			require.NoError(t, err)
			again, _ := io.ReadAll(r)
			assert.Equal(t, "hello", string(again))
		}
	})
	t.Run("declared length reached counts as whole", func(t *testing.T) {
		b := newReplayBody(io.NopCloser(strings.NewReader("hello")), 5)
		p := make([]byte, 5)
		n, err := io.ReadFull(b, p)
		require.NoError(t, err)
		assert.Equal(t, 5, n)
		assert.True(t, b.replayable())
	})
	t.Run("partly read is not replayable", func(t *testing.T) {
		b := newReplayBody(io.NopCloser(strings.NewReader("hello world")), -1)
		_, _ = b.Read(make([]byte, 3))
		assert.False(t, b.replayable())
		require.NoError(t, b.Close())
		assert.False(t, b.replayable(), "closed before its end")
	})
	t.Run("past the cap is not replayable", func(t *testing.T) {
		b := newReplayBody(io.NopCloser(bytes.NewReader(make([]byte, MaxRetryBodyBytes+1))), -1)
		n, err := io.Copy(io.Discard, b)
		require.NoError(t, err)
		assert.Equal(t, int64(MaxRetryBodyBytes+1), n, "the body passes whole")
		assert.False(t, b.replayable())
	})
	t.Run("a read error is not replayable", func(t *testing.T) {
		b := newReplayBody(io.NopCloser(io.MultiReader(strings.NewReader("ab"), iotestErr{})), -1)
		_, err := io.ReadAll(b)
		require.Error(t, err)
		assert.False(t, b.replayable())
	})
	t.Run("released once the response went to the caller", func(t *testing.T) {
		b := newReplayBody(io.NopCloser(strings.NewReader("hi")), -1)
		_, _ = io.ReadAll(b)
		b.release()
		assert.False(t, b.replayable())
		var none *replayBody
		none.release()
		assert.True(t, none.replayable(), "no body: nothing to replay")
	})
}

type iotestErr struct{}

func (iotestErr) Read([]byte) (int, error) { return 0, errors.New("connection reset") }

// blockingSource is a request body whose reads wait for data or close.
type blockingSource struct {
	data   chan []byte
	closed chan struct{}
}

func (s *blockingSource) Read(p []byte) (int, error) {
	select {
	case d := <-s.data:
		return copy(p, d), nil
	case <-s.closed:
		return 0, io.ErrClosedPipe
	}
}

func (s *blockingSource) Close() error { close(s.closed); return nil }

func TestAbortBody(t *testing.T) {
	src := &blockingSource{data: make(chan []byte, 1), closed: make(chan struct{})}
	ctx, cancel := context.WithCancelCause(context.Background())
	b := newAbortBody(ctx, src)
	src.data <- []byte("chunk")
	p := make([]byte, 3)
	n, err := b.Read(p)
	require.NoError(t, err)
	assert.Equal(t, "chu", string(p[:n]))
	n, err = b.Read(p)
	require.NoError(t, err)
	assert.Equal(t, "nk", string(p[:n]), "the rest of the chunk first")

	// A read waiting on the source returns when the context ends.
	done := make(chan error, 1)
	go func() { _, err := b.Read(p); done <- err }()
	cancel(classify.ErrTimeout)
	assert.ErrorIs(t, <-done, classify.ErrTimeout)
	_, err = b.Read(p)
	assert.ErrorIs(t, err, classify.ErrTimeout, "sticky")
	// The reader goroutine may be inside the source's read, or may have
	// seen the context's end first; either way it closes the source once
	// that read returns.
	src.data <- []byte("late")
	<-src.closed
	require.NoError(t, b.Close())
}

// A read waiting on the source returns when the body is closed: Go's
// HTTP/2 transport closes a request body it stops sending (the response
// ended before the body did) and waits for the read under way, and a
// retry's discard of that response waits for the transport. A read that
// waited on for the source held the retry back until the route's timeout.
func TestAbortBodyCloseDuringRead(t *testing.T) {
	defer goleak.VerifyNone(t)
	src := &enteringSource{blockingSource: blockingSource{data: make(chan []byte), closed: make(chan struct{})}, entered: make(chan struct{}, 1)}
	b := newAbortBody(context.Background(), src)
	done := make(chan error, 1)
	go func() { _, err := b.Read(make([]byte, 8)); done <- err }()
	<-src.entered // the reader goroutine is in the source's read
	require.NoError(t, b.Close())
	select {
	case err := <-done:
		assert.ErrorIs(t, err, errBodyClosed)
	case <-time.After(testutil.Timeout):
		t.Fatal("a read waiting on the source outlived Close")
	}
	src.data <- []byte("late") // the source's read returns; the reader closes it
	<-src.closed
}

// enteringSource tells when a read begins.
type enteringSource struct {
	blockingSource
	entered chan struct{}
}

func (s *enteringSource) Read(p []byte) (int, error) {
	select {
	case s.entered <- struct{}{}:
	default:
	}
	return s.blockingSource.Read(p)
}

func TestAbortBodyCloseBeforeRead(t *testing.T) {
	src := &blockingSource{data: make(chan []byte), closed: make(chan struct{})}
	b := newAbortBody(context.Background(), src)
	require.NoError(t, b.Close())
	<-src.closed
	_, err := b.Read(make([]byte, 1))
	assert.Error(t, err)
}
