package destination

import (
	"context"
	"errors"
	"fmt"
	"google.golang.org/grpc"
	"io"
	"iter"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/inmesh/inmesh/backoff"
	"github.com/inmesh/inmesh/internal/mailbox"
	"github.com/inmesh/inmesh/proxyapi/watchespb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// errFirstMessageTimeout is why a stream that stayed silent was abandoned.
var errFirstMessageTimeout = errors.New("destination: no message before the first-message deadline")

// errStreamEnded is why a stream that the server closed cleanly is
// re-established.
var errStreamEnded = errors.New("destination: stream ended")

// recvStream is the receiving half of a server-streaming call.
type recvStream[M any] interface{ Recv() (M, error) }

// kind is what differs between the two watched RPCs.
type kind[M, U any] struct {
	name string
	// open starts the call for a target, with opts (waitForReady, or
	// none for a call that fails at once when the control plane cannot be
	// reached). It returns the stream for the caller to read into s, or
	// a nil stream when the call delivers to s by itself (a subscription
	// on the Watches stream): such a call makes s's muxSub its
	// subscription (see [sink]) and needs ctx no longer; a stream ends
	// with ctx.
	open func(ctx context.Context, target string, s sink[M], opts ...grpc.CallOption) (recvStream[M], error)
	// decode converts a message of one of the watch's streams into the
	// update to publish, and reports whether there is one. prev is the
	// update the stream published last, and fresh says that it published
	// none yet: a stream's state is what it published, which the watch
	// holds anyway, so a stream keeps no decoder state of its own.
	decode func(key string, prev U, fresh bool, m M) (U, bool)
	// rejected is the last update of a watch the server rejected.
	rejected func(err error) U
	// silent, when set, is the update that a stream silent past the
	// first-message deadline stands for; the stream is then kept open.
	// When nil, such a stream counts as failed and is re-established.
	silent func() U
	// notFound, when set, is the update that the control plane's answer
	// "no such target" stands for (see isNotFound): Linkerd's controllers
	// answer a Service that does not exist so, where inmesh's embedded
	// control plane once sent no_endpoints{exists: false} or a default.
	// It is published once per run of such answers; the watch keeps
	// asking, with backoff, for the target may appear later.
	notFound func() U
	// unanswered, when set, is the update that stands for an answer that
	// cannot come, published when the watch has published nothing yet: the
	// control plane does not serve the RPC (Unimplemented, as Linkerd's
	// destination controller alone answers OutboundPolicies), refuses the
	// caller, or cannot be reached. Whoever waits for the first answer then
	// stops waiting; the watch keeps trying and a later answer applies as
	// usual. When nil, such a watch publishes nothing until an answer.
	unanswered func(err error) U
	// probe, when set (and unanswered is not), opens the streams of a
	// watch that has published nothing first without waiting for the
	// connection: when the control plane cannot be reached, gRPC's word
	// for why (refused, a failed TLS handshake) is recorded in the
	// client's reach, and the stream is opened again at once, waiting
	// for the connection as usual.
	probe bool
}

// isNotFound reports whether err is the control plane's answer that the
// target does not exist: NotFound (Get: "Service name.ns not found";
// OutboundPolicies: "unknown target"), or the Unknown "service \"name\"
// not found" that Linkerd's controller passes on from Kubernetes for
// GetProfile (controller/api/destination/server.go
// subscribeToServiceProfile).
func isNotFound(err error) bool {
	st, ok := status.FromError(err)
	if !ok {
		return false
	}
	switch st.Code() {
	case codes.NotFound:
		return true
	case codes.Unknown:
		return strings.HasSuffix(st.Message(), " not found")
	}
	return false
}

// watch is one shared stream for one authority, fanned out to subscribers.
// It holds no goroutine of its own: see [watch.attempt]. A client holds
// one for each kind of each of thousands of names, so its fields are
// packed: its client and kind are its set's.
type watch[M, U any] struct {
	ws        *watches[M, U] // the set it is in (or was, once evicted)
	authority string

	mu   sync.Mutex
	last U
	// subs are the watch's mailboxes, in no order.
	subs subList[U]
	// idleTimer closes the watch after the idle timeout. It is stopped
	// when the watch is subscribed again or evicted first, and it holds
	// the watch weakly, so that an evicted watch is not kept alive by its
	// timer: under a churn of new names past the bound, every timer would
	// otherwise hold an evicted watch and its last state for the whole
	// idle timeout.
	idleTimer *time.Timer
	// cur is the current stream, which stop ends; retry opens the next
	// one after the backoff's delay. A watch has no context of its own:
	// each one would be registered with the client's until it ends, and
	// a client holds thousands of watches.
	cur   *session[M, U]
	retry *time.Timer
	// idleGen is bumped on every subscribe, so that a stale idle timer
	// does nothing.
	idleGen uint32
	// attempts is the backoff's attempt, part of the state across
	// streams (with failing and announced, below), touched by one
	// stream's end at a time (see [watch.ended]).
	attempts int32

	// stopped says that the watch ended, so that no stream opens again.
	stopped bool
	hasLast bool
	// lastNotFound: last is the kind's notFound update, the control
	// plane's word that the target does not exist, not a state a stream
	// delivered.
	lastNotFound bool
	// lastUnanswered: last is the kind's unanswered update, the client's
	// own word that no answer could come, not a state a stream delivered.
	lastUnanswered bool
	evicted        bool

	// failing says that the last stream failed, and announced that the
	// notFound update was published for the current run of such answers:
	// with attempts, the state across streams. They are not under mu;
	// they sit with the flags above so that they share a word.
	failing   bool
	announced bool
}

// subList is a watch's mailboxes: nearly every watch has one or two, where
// a slice would cost a header in the watch and an array beside it.
type subList[U any] struct {
	first *mailbox.Mailbox[U]
	rest  *[]*mailbox.Mailbox[U]
}

func (l *subList[U]) len() int {
	n := 0
	if l.first != nil {
		n++
	}
	if l.rest != nil {
		n += len(*l.rest)
	}
	return n
}

func (l *subList[U]) add(s *mailbox.Mailbox[U]) {
	switch {
	case l.first == nil:
		l.first = s
	case l.rest == nil:
		l.rest = &[]*mailbox.Mailbox[U]{s}
	default:
		*l.rest = append(*l.rest, s)
	}
}

// remove takes s off the list.
func (l *subList[U]) remove(s *mailbox.Mailbox[U]) {
	if l.rest == nil {
		if l.first == s {
			l.first = nil
		}
		return
	}
	rest := *l.rest
	last := len(rest) - 1
	if l.first == s {
		l.first = rest[last]
	} else if i := slices.Index(rest, s); i >= 0 {
		rest[i] = rest[last]
	} else {
		return
	}
	rest[last] = nil
	if last == 0 {
		l.rest = nil
	} else {
		*l.rest = rest[:last]
	}
}

// all returns the mailboxes.
func (l *subList[U]) all() iter.Seq[*mailbox.Mailbox[U]] {
	return func(yield func(*mailbox.Mailbox[U]) bool) {
		if l.first != nil && !yield(l.first) {
			return
		}
		if l.rest != nil {
			for _, s := range *l.rest {
				if !yield(s) {
					return
				}
			}
		}
	}
}

// watches is a bounded set of watches of one kind, keyed by authority.
type watches[M, U any] struct {
	c    *Client
	kind *kind[M, U]
	mu   sync.Mutex
	m    map[string]*watch[M, U]
	// idle holds the watches of m that nobody watches any more, kept for
	// their idle timeout: at the bound, one of them makes room.
	idle map[*watch[M, U]]struct{}
	// rejected counts watches refused for the bound.
	rejected atomic.Uint64
}

func (ws *watches[M, U]) subscribe(c *Client, ctx context.Context, authority string, update func(U)) (func(), error) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if c.ctx.Err() != nil {
		return nil, ErrClosed
	}
	w := ws.m[authority]
	if w == nil {
		if len(ws.m) >= c.cfg.watchCap() && !ws.evictIdleLocked() {
			ws.rejected.Add(1)
			return nil, fmt.Errorf("%w: %d %s watches already", errTooManyWatches, len(ws.m), ws.kind.name)
		}
		w = &watch[M, U]{ws: ws, authority: authority}
		ws.m[authority] = w
		// Counts the watch until it ended (see [watch.ended]).
		c.wg.Add(1)
		go w.attempt()
	}

	// s is added under w.mu, which w.MailboxFinished also takes, so even
	// a mailbox whose context is already done is removed again.
	delete(ws.idle, w)
	w.mu.Lock()
	w.stopIdleTimerLocked()
	// The mailbox ends with ctx, with Stop, or when the client closes
	// (stopAll), not by a hook on the client's context.
	s := mailbox.StartOwned(context.Background(), ctx, &c.wg, update, w)
	w.subs.add(s)
	w.idleGen++
	if w.hasLast {
		s.Offer(w.last)
	}
	w.mu.Unlock()
	return s.Stop, nil
}

// c returns the watch's client.
func (w *watch[M, U]) c() *Client { return w.ws.c }

// kind returns the watch's kind.
func (w *watch[M, U]) kind() *kind[M, U] { return w.ws.kind }

// MailboxFinished takes the finished mailbox s of a subscriber off w: see
// [watches.unsubscribe].
func (w *watch[M, U]) MailboxFinished(s *mailbox.Mailbox[U]) { w.ws.unsubscribe(w, s) }

// unsubscribe removes s from w and, when w has no subscribers left, closes
// it after the idle timeout.
func (ws *watches[M, U]) unsubscribe(w *watch[M, U], s *mailbox.Mailbox[U]) {
	w.mu.Lock()
	w.subs.remove(s)
	idle := w.subs.len() == 0
	gen := w.idleGen
	w.mu.Unlock()
	if !idle || w.c().ctx.Err() != nil {
		return
	}
	d := w.c().cfg.idleTimeout
	ws.mu.Lock()
	w.mu.Lock()
	if w.subs.len() == 0 && !w.evicted && w.idleGen == gen && d > 0 {
		if ws.idle == nil {
			ws.idle = make(map[*watch[M, U]]struct{})
		}
		ws.idle[w] = struct{}{}
		w.stopIdleTimerLocked()
		// The timer holds w weakly: the runtime may keep a stopped timer,
		// and what it would call, in its timer heap until the timer's
		// deadline, and a watch evicted first must be freed then, not
		// an idle timeout later. Until it is evicted, ws holds w.
		ref := weak.Make(w)
		w.idleTimer = time.AfterFunc(d, func() {
			if w := ref.Value(); w != nil {
				ws.evict(w, gen)
			}
		})
	}
	w.mu.Unlock()
	ws.mu.Unlock()
	if d <= 0 {
		ws.evict(w, gen)
	}
}

// stopIdleTimerLocked stops w's idle timer, if any. The caller holds w.mu.
func (w *watch[M, U]) stopIdleTimerLocked() {
	if w.idleTimer != nil {
		w.idleTimer.Stop()
		w.idleTimer = nil
	}
}

// evict closes w if nobody subscribed since generation gen.
func (ws *watches[M, U]) evict(w *watch[M, U], gen uint32) {
	ws.mu.Lock()
	w.mu.Lock()
	stale := w.idleGen != gen || w.subs.len() > 0 || w.evicted
	if !stale {
		w.evicted = true
		w.stopIdleTimerLocked()
		delete(ws.m, w.authority)
		delete(ws.idle, w)
	}
	w.mu.Unlock()
	ws.mu.Unlock()
	if !stale {
		w.stop()
	}
}

// evictIdleLocked closes one stream that nobody watches any more (one
// kept for its idle timeout), making room for a new watch; it reports
// whether there was one. The caller holds ws.mu.
func (ws *watches[M, U]) evictIdleLocked() bool {
	for w := range ws.idle {
		delete(ws.idle, w)
		w.mu.Lock()
		w.evicted = true
		w.stopIdleTimerLocked()
		w.mu.Unlock()
		delete(ws.m, w.authority)
		w.stop()
		return true
	}
	return false
}

// cached returns the last update of authority's watch, if any.
func (ws *watches[M, U]) cached(authority string) (U, bool) {
	ws.mu.Lock()
	w := ws.m[authority]
	ws.mu.Unlock()
	if w == nil {
		var zero U
		return zero, false
	}
	return w.cached()
}

// stopAll stops every watch and ends its subscribers' mailboxes, when
// the client closes.
func (ws *watches[M, U]) stopAll() {
	ws.mu.Lock()
	all := make([]*watch[M, U], 0, len(ws.m))
	for _, w := range ws.m {
		all = append(all, w)
	}
	ws.mu.Unlock()
	var subs []*mailbox.Mailbox[U]
	for _, w := range all {
		w.stop()
		w.mu.Lock()
		for s := range w.subs.all() {
			subs = append(subs, s)
		}
		w.mu.Unlock()
	}
	for _, s := range subs {
		s.Stop()
	}
}

func (ws *watches[M, U]) len() int {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return len(ws.m)
}

func (w *watch[M, U]) publish(u U) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.publishLocked(u)
}

func (w *watch[M, U]) publishLocked(u U) {
	w.last, w.hasLast, w.lastNotFound, w.lastUnanswered = u, true, false, false
	for s := range w.subs.all() {
		s.Offer(u)
	}
}

// answered reports whether the watch has published anything.
func (w *watch[M, U]) answered() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.hasLast
}

// cached returns the last update of the watch, if any.
func (w *watch[M, U]) cached() (U, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.last, w.hasLast
}

// noAnswer publishes the kind's unanswered update when err says that no
// answer can come (see [unanswerable]) and the watch has published
// nothing yet.
func (w *watch[M, U]) noAnswer(err error, failFast bool) {
	if w.kind().unanswered == nil || !unanswerable(err, failFast) {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.hasLast {
		return
	}
	w.c().log.Info("unanswered "+w.kind().name, "no answer can come from the control plane for now; proceeding without one, still watching",
		"rpc", w.kind().name, targetAttr(w.authority), "error", streamCause(err))
	w.publishLocked(w.kind().unanswered(err))
	w.lastUnanswered = true
}

// ErrUnreachable is in the error of a profile or policy update (errors.Is)
// when no stream to the control plane could be opened: it was not reached,
// and said nothing. An error status the control plane sent is not.
var ErrUnreachable = errors.New("destination: the control plane cannot be reached")

// unreachableError is an error of gRPC's that means ErrUnreachable; it
// keeps the gRPC status.
type unreachableError struct{ err error }

func (e *unreachableError) Error() string   { return e.err.Error() }
func (e *unreachableError) Unwrap() []error { return []error{e.err, ErrUnreachable} }

// GRPCStatus is the status of the error inside, its message unchanged.
func (e *unreachableError) GRPCStatus() *status.Status { return status.Convert(e.err) }

// answeredError is the end of a stream that was opened, before its first
// message: an answer, an error status included, that the control plane
// (or what stands in front of it) sent.
type answeredError struct{ err error }

func (e *answeredError) Error() string { return e.err.Error() }
func (e *answeredError) Unwrap() error { return e.err }

// GRPCStatus is the status of the error inside, its message unchanged.
func (e *answeredError) GRPCStatus() *status.Status { return status.Convert(e.err) }

// unanswerable reports whether a stream's error before its first message
// says that no answer will come soon: the control plane does not serve the
// RPC (Unimplemented) or refuses the caller (PermissionDenied,
// Unauthenticated), or, for a call that did not wait for the connection
// (failFast), the control plane cannot be reached (Unavailable: refused,
// unreachable).
func unanswerable(err error, failFast bool) bool {
	switch status.Code(err) {
	case codes.Unimplemented, codes.PermissionDenied, codes.Unauthenticated:
		return true
	case codes.Unavailable:
		return failFast
	}
	return false
}

// sink receives the messages of one stream of a watch, then its end.
// A call that delivers by itself makes the sink's muxSub its subscription,
// then says so (subscribed).
type sink[M any] interface {
	muxSink
	muxSub() *muxSub
	subscribed()
	message(M)
}

// attempt opens a stream for the watch. A stream over Linkerd's API is
// read by this goroutine for as long as it lasts; a subscription on the
// Watches stream delivers to its session by itself (the mux's reader
// dispatches), so the goroutine ends once the subscription is made: a
// watch whose stream is on the mux holds no goroutine of its own.
//
// Every event of a watch (a message, the first-message deadline, a
// stream's end, the backoff's timer) goes through its [session] and
// [watch.ended], on whichever goroutine the event comes: one state
// machine for both paths.
func (w *watch[M, U]) attempt() {
	s := &session[M, U]{w: w}
	s.sub.to = s
	// The context of the call, while it opens, and of a Linkerd stream
	// for its life; a subscription ends by its own means.
	ctx, cancel := context.WithCancel(w.c().ctx)
	s.open = &sessionOpen{cancel: cancel}
	w.mu.Lock()
	stopped := w.stopped
	if !stopped {
		w.cur = s
	}
	w.mu.Unlock()
	if stopped {
		cancel()
		w.ended(ErrClosed)
		return
	}
	// The stream opens once the connection is up (waitForReady), however
	// long that takes; the first-message deadline runs from then, so that
	// an outage is never taken for a silent control plane. The first stream
	// of a kind with an unanswered update, though, fails at once when the
	// control plane cannot be reached, so that nobody waits for an answer
	// that cannot come.
	s.failFast = w.kind().unanswered != nil && !w.answered()
	var stream recvStream[M]
	var err error
	switch {
	case s.failFast:
		stream, err = w.kind().open(ctx, w.authority, s)
	case w.kind().probe && !w.answered():
		stream, err = w.kind().open(ctx, w.authority, s)
		if err != nil && status.Code(err) == codes.Unavailable && ctx.Err() == nil {
			w.c().reach.set(err)
			stream, err = w.kind().open(ctx, w.authority, s, waitForReady)
		}
	default:
		stream, err = w.kind().open(ctx, w.authority, s, waitForReady)
	}
	if err != nil {
		cancel()
		w.mu.Lock()
		if w.cur == s {
			w.cur = nil
		}
		w.mu.Unlock()
		var answered *answeredError
		if s.failFast && status.Code(err) == codes.Unavailable && !errors.As(err, &answered) {
			// No stream could be opened: the control plane was not
			// reached, and said nothing.
			err = &unreachableError{err}
		}
		w.noAnswer(err, s.failFast)
		w.ended(classifyStreamErr(err, false, false))
		return
	}
	s.startDeadline()
	if stream == nil {
		cancel() // the Watches stream delivers to s, which ends it
		return
	}
	for {
		msg, err := stream.Recv()
		if err != nil {
			s.end(err)
			return
		}
		onOwnStack(s.message, msg)
	}
}

// ended is called with the classified error of each stream's end (see
// [classifyStreamErr]): it either re-opens a stream after the backoff's
// next delay or, when the watch was stopped or the server rejected the
// lookup, ends the watch. Its lines go through the client's rate limiter,
// keyed by event and RPC (not by authority): a control plane that flaps
// under thousands of watches writes a line per interval, not a line per
// watch. The ends of a watch's streams come one at a time: the next
// stream opens after this returns.
func (w *watch[M, U]) ended(err error) {
	rpc := w.kind().name
	if backoff.IsPermanent(err) {
		if !w.isStopped() {
			w.c().log.Info("rejected "+rpc, "destination lookup rejected; not watching",
				"rpc", rpc, targetAttr(w.authority), "error", errors.Unwrap(err))
			w.publish(w.kind().rejected(errors.Unwrap(err)))
		}
		w.c().wg.Done()
		return
	}
	if w.isStopped() {
		w.c().wg.Done()
		return
	}
	// NotFound is the control plane's ordinary answer for a target it
	// does not know (yet): a Service with no policy, a name not loaded;
	// the watch says so to its subscribers once and keeps asking,
	// without alarm.
	progress := errors.Is(err, backoff.ErrResetBackoff)
	if progress {
		w.attempts = 0
	}
	delay := w.c().cfg.policy.Delay(int(w.attempts))
	if w.attempts < math.MaxInt32 {
		w.attempts++
	}
	notFound := isNotFound(err)
	if cause := streamCause(err); !notFound && (w.kind().probe || status.Code(cause) == codes.Unavailable) {
		// The inbound policy's own streams say why its ports wait,
		// whatever ended them; the other kinds only when the control
		// plane was not reached (an answer such as Unimplemented to
		// one RPC says nothing of another's).
		w.c().reach.set(cause)
	}
	// A target that a stream delivered a state for keeps that state when
	// a later stream is answered "not found": a control plane that
	// restarted answers so until it has loaded what it serves (Linkerd's
	// controller while it reads a remote cluster's Link, a Service being
	// re-created), and Linkerd's proxy keeps its endpoints and policy
	// through such answers (linkerd/proxy/resolve/src/recover.rs, and
	// tonic-watch for policies). A target that goes away while watched is
	// said on the stream itself (no_endpoints{exists: false}).
	held := false
	if notFound && !w.announced && w.kind().notFound != nil {
		w.mu.Lock()
		if held = w.hasLast && !w.lastNotFound && !w.lastUnanswered; !held {
			w.publishLocked(w.kind().notFound())
			w.lastNotFound = true
		}
		w.mu.Unlock()
	}
	w.announced = notFound
	switch {
	case held:
		w.c().log.Info("not found after state "+rpc, "the control plane answered that it knows no such target after it had served one; keeping the last state and asking again later",
			"rpc", rpc, targetAttr(w.authority), "error", err, "delay", delay)
	case notFound:
		w.c().log.Debug("not found "+rpc, "the control plane knows no such target; asking again later",
			"rpc", rpc, targetAttr(w.authority), "error", err, "delay", delay)
	case progress:
		// The stream delivered updates, then ended (a control plane
		// restart, a load balancer's idle cut): an event, not a failure.
		w.c().log.Info("stream ended "+rpc, "destination stream ended after updates; re-establishing",
			"rpc", rpc, targetAttr(w.authority), "cause", streamCause(err), "delay", delay)
	case !w.failing:
		w.c().log.Warn("stream failed "+rpc, "destination stream failed; re-establishing",
			"rpc", rpc, targetAttr(w.authority), "error", err, "delay", delay)
	default:
		w.c().log.Debug("stream failed again "+rpc, "destination stream failed; re-establishing",
			"rpc", rpc, targetAttr(w.authority), "error", streamCause(err), "delay", delay)
	}
	// An answer, even "not found", is a control plane that works.
	w.failing = !progress && !notFound

	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		w.c().wg.Done()
		return
	}
	w.retry = time.AfterFunc(delay, w.attempt)
}

// isStopped reports whether the watch or its client ended.
func (w *watch[M, U]) isStopped() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stopped || w.c().ctx.Err() != nil
}

// stop ends the watch: its stream ends, or its next attempt is called
// off. It is safe to call more than once.
func (w *watch[M, U]) stop() {
	w.mu.Lock()
	s, t := w.cur, w.retry
	w.cur, w.retry, w.stopped = nil, nil, true
	w.mu.Unlock()
	if s != nil {
		s.stop()
	}
	if t != nil && t.Stop() {
		w.c().wg.Done() // the attempt that would have seen the end
	}
}

// session is one stream of a watch, fed by the stream's reader (a
// goroutine of its own for a Linkerd stream, the mux's reader for a
// subscription on the Watches stream) and by its first-message deadline.
//
// A stream silent past the first-message deadline is either cut and retried
// (GetProfile: the controller always answers at once) or kept open (Get:
// Linkerd's controller says nothing for a service with no endpoints), with
// the kind's silent update published only when the watch has published
// nothing yet: a stream that replaces one which delivered keeps what was
// delivered, so a control plane that accepts streams and never answers
// cannot take the last good state away. Either way the silence counts as
// progress, so a later failure reconnects after the shortest delay.
type session[M, U any] struct {
	w *watch[M, U]

	// mu orders the deadline's update before any message's, so that a
	// first message racing the deadline is never overwritten by it.
	mu sync.Mutex
	// open is what the stream needs while it opens, and only then on the
	// Watches stream: nil once neither is left, as a client holds a
	// session for each of its thousands of watches.
	open *sessionOpen

	failFast bool
	// published says that the stream published an update (see
	// [kind.decode]); it is read and set by the stream's messages alone,
	// which come one at a time.
	published bool
	received  bool
	timedOut  bool
	done      bool
	// onMux says that sub is made, and stop ends it.
	onMux bool

	// sub is the session's subscription on the Watches stream, when the
	// stream is one: held here rather than beside it, as a client holds
	// a stream for each of its thousands of watches.
	sub muxSub
}

// sessionOpen is what a session holds while its stream opens.
type sessionOpen struct {
	// cancel ends the call's context: a Linkerd stream's for its life, a
	// subscription's until it is made (nil then: see subscribed).
	cancel context.CancelFunc
	// deadline is the first-message deadline, until the first message.
	deadline *time.Timer
}

// dropOpenLocked lets go of s.open once it holds nothing. The caller
// holds s.mu.
func (s *session[M, U]) dropOpenLocked() {
	if o := s.open; o != nil && o.cancel == nil && o.deadline == nil {
		s.open = nil
	}
}

// muxSub returns s's subscription on the Watches stream, for the mux to
// make.
func (s *session[M, U]) muxSub() *muxSub { return &s.sub }

// subscribed says that s's subscription is made: it, not the call's
// context, ends the stream from now on. When s ended meanwhile, the
// subscription ends at once.
func (s *session[M, U]) subscribed() {
	s.mu.Lock()
	done := s.done
	if !done {
		s.onMux = true
		if s.open != nil {
			s.open.cancel = nil
			s.dropOpenLocked()
		}
	}
	s.mu.Unlock()
	if done {
		s.sub.unsubscribe()
	}
}

// stop ends the stream: it cancels the call's context, or ends the
// subscription on the Watches stream.
func (s *session[M, U]) stop() {
	s.mu.Lock()
	var cancel context.CancelFunc
	if s.open != nil {
		cancel = s.open.cancel
	}
	onMux := s.onMux
	s.mu.Unlock()
	if onMux {
		s.sub.unsubscribe()
		return
	}
	if cancel != nil {
		cancel()
	}
}

// startDeadline starts the first-message deadline, unless a message or
// the end came first.
func (s *session[M, U]) startDeadline() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.received && !s.done {
		if s.open == nil {
			s.open = new(sessionOpen)
		}
		s.open.deadline = time.AfterFunc(s.w.c().cfg.firstMessageTimeout, s.silent)
	}
}

// silent runs at the first-message deadline.
func (s *session[M, U]) silent() {
	w := s.w
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.received || s.done {
		return
	}
	s.timedOut = true
	if w.kind().silent == nil {
		go s.stop() // not under s.mu, which the stream's end takes
		return
	}
	w.mu.Lock()
	known := w.hasLast && !w.lastNotFound
	w.mu.Unlock()
	if known {
		// This stream replaces one that delivered: its silence says
		// nothing new (a wedged or restarting control plane), so what
		// was delivered stays in force until a message replaces it.
		// After "not found", though, a stream the control plane
		// accepts says the target exists now: its silence is "no
		// endpoints yet", as for a new authority.
		w.c().log.Info("silent again "+w.kind().name,
			"destination stream silent past the first-message deadline; the last state stays in force",
			"rpc", w.kind().name, targetAttr(w.authority))
		return
	}
	w.c().log.Debug("silent "+w.kind().name,
		"destination stream silent past the first-message deadline; no endpoints yet",
		"rpc", w.kind().name, targetAttr(w.authority))
	w.publish(w.kind().silent())
}

// message applies one message of the stream. The messages of a session
// come one at a time, in order.
func (s *session[M, U]) message(msg M) {
	s.mu.Lock()
	if !s.received {
		s.received = true
		if s.open != nil && s.open.deadline != nil {
			s.open.deadline.Stop()
			s.open.deadline = nil // not kept for the stream's life
			s.dropOpenLocked()
		}
	}
	s.mu.Unlock()
	w := s.w
	w.c().reach.clear()
	// Once the stream published, the watch's last update is the
	// stream's: nothing else publishes while a stream delivers (its
	// silence is over, and its end comes after its last message).
	w.mu.Lock()
	prev := w.last
	w.mu.Unlock()
	if u, ok := w.kind().decode(w.authority, prev, !s.published, msg); ok {
		s.published = true
		w.publish(u)
	}
}

// answer takes an answer of a subscription on the Watches stream.
func (s *session[M, U]) answer(r *watchespb.WatchResponse) {
	if m, ok := answerOf[M](r); ok {
		s.message(m)
	}
}

// end is the stream's end, with the error that ended it; it is called
// once, after the last message.
func (s *session[M, U]) end(err error) {
	s.mu.Lock()
	s.done = true
	if s.open != nil && s.open.deadline != nil {
		s.open.deadline.Stop()
	}
	progressed := s.received || (s.timedOut && s.w.kind().silent != nil)
	silent := s.timedOut && s.w.kind().silent == nil
	s.mu.Unlock()
	s.stop()
	w := s.w
	w.mu.Lock()
	if w.cur == s {
		w.cur = nil
	}
	w.mu.Unlock()
	if !progressed {
		w.noAnswer(err, s.failFast)
	}
	w.ended(classifyStreamErr(err, progressed, silent))
}

// onOwnStack runs fn(msg) on a goroutine of its own: the conversion of a
// message (a profile's routes, a policy's compiled rules) needs a deep
// stack for a moment, and a stream's goroutine, parked between messages
// for as long as the stream lives, would keep a stack grown to that
// depth. A process watching thousands of names over Linkerd's streams
// holds thousands of these goroutines.
func onOwnStack[M any](fn func(M), msg M) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(msg)
	}()
	<-done
}

func classifyStreamErr(err error, progressed, silent bool) error {
	switch {
	case silent:
		err = errFirstMessageTimeout
	case errors.Is(err, io.EOF):
		err = errStreamEnded
	}
	switch status.Code(err) {
	case codes.InvalidArgument, codes.FailedPrecondition:
		return backoff.Permanent(fmt.Errorf("%w: %w", ErrRejected, err))
	}
	if progressed {
		return fmt.Errorf("%w: %w", backoff.ErrResetBackoff, err)
	}
	return err
}

// targetAttr is the log attribute of a watch's key: an authority, or the
// OutboundPolicies target the key names ("authority=host:port" or
// "addr=ip:port"), under its own name.
func targetAttr(key string) slog.Attr {
	if a, ok := strings.CutPrefix(key, "authority="); ok {
		return slog.String("authority", a)
	}
	if a, ok := strings.CutPrefix(key, "addr="); ok {
		return slog.String("addr", a)
	}
	return slog.String("authority", key)
}

// streamCause returns why a stream ended, without the marker that says it
// made progress first.
func streamCause(err error) error {
	if m, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range m.Unwrap() {
			if !errors.Is(e, backoff.ErrResetBackoff) {
				return e
			}
		}
	}
	return err
}

// waitForReady makes a watch's stream wait for the connection to the
// control plane instead of failing at once while it is down: the
// connection's reconnection, paced by the client's backoff policy (the
// dialer), is then the only delay between the control plane's return and
// the streams, rather than a stream backoff in series with it.
var waitForReady = grpc.WaitForReady(true)
