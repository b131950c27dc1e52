package manifest

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"time"

	authpkg "github.com/inmesh/inmesh/internal/authority"
	"github.com/inmesh/inmesh/internal/filestamp"
	"github.com/inmesh/inmesh/internal/mailbox"
	"github.com/inmesh/inmesh/internal/ratelog"
	"github.com/inmesh/inmesh/profiles"
)

// ProfileSource is a [profiles.Source] of ServiceProfile YAML files (*.yaml, *.yml) in
// a directory, read again when the files change. A ServiceProfile serves
// every port of its name. A changed file is loaded once it stayed the same
// for one poll interval, so that a copy caught half-way is not loaded, and a
// file that changes while it is read is read again at the next poll. A
// broken file (bad YAML, a duplicate key, a bad field, an empty or
// truncated file) is reported (Err, and a log line naming the file and the
// field, rate-limited, and never suppressed after a load) and the last good
// profiles stay in force; a load that follows a rejection is logged too. A
// ProfileSource is safe for concurrent use; Close stops it.
type ProfileSource struct {
	dir      string
	interval time.Duration
	log      *ratelog.Logger
	settle   filestamp.Settle // used by the poll loop only

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}

	mu       sync.Mutex
	byName   map[string]*profiles.ServiceProfile
	stamp    string
	err      error
	watchers map[*profileWatch]struct{}
}

type profileWatch struct {
	host string
	port uint32
	m    *mailbox.Mailbox[profiles.Update]
}

var _ profiles.Source = (*ProfileSource)(nil)

// Option configures a [ProfileSource]; a nil Option changes nothing.
type Option interface{ apply(*config) }

type config struct {
	interval time.Duration
	log      *slog.Logger
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// WithPollInterval sets how often a [ProfileSource] checks its directory for
// changes (default 1s); d <= 0 changes nothing.
func WithPollInterval(d time.Duration) Option {
	return optionFunc(func(c *config) {
		if d > 0 {
			c.interval = d
		}
	})
}

// WithLogger sets where a [ProfileSource] reports files it rejects
// (default slog.Default()); nil changes nothing.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) {
		if l != nil {
			c.log = l
		}
	})
}

// NewProfileSource reads dir and checks it for changes as [WithPollInterval]
// says. It fails only when the first read fails.
func NewProfileSource(dir string, opts ...Option) (*ProfileSource, error) {
	cfg := config{interval: time.Second, log: slog.Default()}
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	s := &ProfileSource{dir: dir, interval: cfg.interval, log: ratelog.New(cfg.log, 0), done: make(chan struct{}), watchers: make(map[*profileWatch]struct{})}
	if err := s.reload(); err != nil {
		return nil, err
	}
	s.settle.Loaded(s.stamp)
	s.ctx, s.cancel = context.WithCancel(context.Background())
	go s.poll()
	return s, nil
}

// Close stops watching the directory and every watch.
func (s *ProfileSource) Close() {
	s.cancel()
	<-s.done
	s.mu.Lock()
	ws := make([]*profileWatch, 0, len(s.watchers))
	for w := range s.watchers {
		ws = append(ws, w)
	}
	s.mu.Unlock()
	for _, w := range ws {
		w.m.Stop()
	}
}

// Err returns the error of the last read, nil when it was good.
func (s *ProfileSource) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

func (s *ProfileSource) poll() {
	defer close(s.done)
	t := time.NewTicker(s.interval)
	defer t.Stop()
	rejected := false
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
			paths, stamp, err := filestamp.YAMLFiles(s.dir)
			if err != nil {
				s.setErr(err)
				s.log.Warn("profile dir", "cannot list the profile files; keeping the last good profiles", "dir", s.dir, "error", err)
				continue
			}
			if !s.settle.Ready(stamp) {
				continue
			}
			err = s.load(paths, stamp)
			switch {
			case errors.Is(err, profiles.ErrFileChanged):
				s.log.Debug("profile file changed", "a profile file changed while it was read", "dir", s.dir, "error", err)
				continue // read again at the next poll
			case err != nil:
				if !rejected {
					s.log.Forget("profile files rejected") // a change of state: never suppressed
				}
				rejected = true
				s.log.WarnErr("profile files rejected", "profile files rejected; keeping the last good profiles", err, "dir", s.dir)
			case rejected:
				rejected = false
				s.log.Slog().Info("profile files loaded after a rejection", "dir", s.dir, "files", len(paths))
			}
			s.settle.Loaded(stamp)
		}
	}
}

// Reload reads the directory now, without waiting for changed files to
// settle as the poll loop does, and returns what Err would.
func (s *ProfileSource) Reload() error { return s.reload() }

func (s *ProfileSource) reload() error {
	paths, stamp, err := filestamp.YAMLFiles(s.dir)
	if err != nil {
		s.setErr(err)
		return err
	}
	s.mu.Lock()
	same := stamp == s.stamp && s.byName != nil
	s.mu.Unlock()
	if same {
		return nil
	}
	return s.load(paths, stamp)
}

// load reads paths (of stamp) and, when all are good, swaps them in.
func (s *ProfileSource) load(paths []string, stamp string) error {
	sps, err := profiles.LoadServiceProfileFiles(paths...)
	s.mu.Lock()
	defer s.mu.Unlock()
	if errors.Is(err, profiles.ErrFileChanged) {
		return err
	}
	s.stamp = stamp
	if err != nil {
		s.err = err
		return err
	}
	s.err = nil
	s.byName = make(map[string]*profiles.ServiceProfile, len(sps))
	for _, sp := range sps {
		s.byName[strings.ToLower(sp.Name)] = sp
	}
	for w := range s.watchers {
		w.m.Offer(s.updateLocked(w))
	}
	return nil
}

func (s *ProfileSource) setErr(err error) {
	s.mu.Lock()
	s.err = err
	s.mu.Unlock()
}

func (s *ProfileSource) updateLocked(w *profileWatch) profiles.Update {
	if sp := s.byName[w.host]; sp != nil {
		return profiles.Update{Profile: sp.ProfileFor(w.port)}
	}
	return profiles.Update{}
}

// Watch implements [profiles.Source].
func (s *ProfileSource) Watch(ctx context.Context, authority string, update func(profiles.Update)) (func(), error) {
	host, port, err := authpkg.Split(authority)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	w := &profileWatch{host: host, port: port}
	w.m = mailbox.Start(s.ctx, ctx, nil, update, func() {
		s.mu.Lock()
		delete(s.watchers, w)
		s.mu.Unlock()
	})
	s.watchers[w] = struct{}{}
	w.m.Offer(s.updateLocked(w))
	return w.m.Stop, nil
}
