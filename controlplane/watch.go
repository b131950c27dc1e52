package controlplane

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/inmesh/inmesh/internal/filestamp"
	"github.com/inmesh/inmesh/internal/ratelog"
)

// WatchFiles loads the ServiceProfile YAML files (*.yaml, *.yml) of
// profilesDir and the endpoints file into store, then checks them every
// interval (default 1s when interval <= 0) and loads again what changed,
// until ctx is done. Either path may be empty. Of the package's options it
// uses [WithLogger] and [WithLogInterval].
//
// A changed file is loaded once it stayed the same for one interval, so that
// a copy caught half-way is not loaded; a file that changes while it is read
// is read again at the next poll. A file that fails to load (bad YAML, a
// duplicate key, a bad field, an empty or truncated file) is logged with its
// file, document and field, and the store keeps serving the last good
// version. A change of state is always logged: a load that follows a
// rejection, and a rejection that follows a load even when the same
// mistake was named within the log interval; repeats of one state are
// limited to one line per interval. WatchFiles returns the error of the
// first load, without watching, when it fails.
func WatchFiles(ctx context.Context, store *Store, profilesDir, endpointsFile string, interval time.Duration, opts ...Option) error {
	cfg := newConfig(opts)
	if interval <= 0 {
		interval = time.Second
	}
	w := newFileWatcher(store, cfg)
	w.dir, w.endpoints = profilesDir, endpointsFile
	if err := w.load(true); err != nil {
		return err
	}
	go w.run(ctx, interval)
	return nil
}

type fileWatcher struct {
	store                     *Store
	dir, endpoints            string
	manifests                 string
	log                       *ratelog.Logger
	profilesSrc, endpointsSrc source
	manifestsSrc              source
}

func newFileWatcher(store *Store, cfg config) *fileWatcher {
	return &fileWatcher{store: store, log: ratelog.New(cfg.logger, cfg.logInterval),
		profilesSrc: source{what: "profiles"}, endpointsSrc: source{what: "endpoints"}, manifestsSrc: source{what: "manifests"}}
}

// source is the state of one kind of file a fileWatcher loads.
type source struct {
	what     string // "profiles", "endpoints", "manifests": in log keys
	settle   filestamp.Settle
	rejected bool // the last read was refused
	// troubled: what the last read loaded has problems (it loads but
	// cannot work as written), which were logged.
	troubled bool
}

func (w *fileWatcher) run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_ = w.load(false) // every rejection is logged by load
		}
	}
}

// load reads what changed; first loads everything at once and returns the
// errors instead of logging them.
func (w *fileWatcher) load(first bool) error {
	var errs []string
	keep := func(err error) {
		if err != nil {
			errs = append(errs, err.Error())
		}
	}
	if w.dir != "" {
		paths, stamp, err := filestamp.YAMLFiles(w.dir)
		keep(w.step(&w.profilesSrc, first, stamp, err, func() error { return w.store.LoadServiceProfiles(paths...) },
			"loaded service profiles", "dir", w.dir, "files", len(paths)))
	}
	if w.endpoints != "" {
		stamp, err := filestamp.File(w.endpoints)
		keep(w.step(&w.endpointsSrc, first, stamp, err, func() error { return w.store.LoadEndpoints(w.endpoints) },
			"loaded endpoints", "file", w.endpoints))
	}
	if w.manifests != "" {
		paths, stamp, err := filestamp.YAMLFiles(w.manifests)
		keep(w.step(&w.manifestsSrc, first, stamp, err, func() error { return w.store.LoadManifests(paths...) },
			"loaded policy manifests", "dir", w.manifests, "files", len(paths)))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

// step loads one source when its files changed and settled (at once when
// first) and logs the outcome; it returns the error of a bad file only
// when first. A change of state, a rejection after a load, a load after a
// rejection or after a load with problems, is always logged: the last
// line says what is served.
func (w *fileWatcher) step(src *source, first bool, stamp string, statErr error, load func() error, loadedMsg string, args ...any) error {
	err := statErr
	if err == nil {
		if !first && !src.settle.Ready(stamp) {
			return nil
		}
		err = load()
		if errors.Is(err, filestamp.ErrChanged) {
			// Not recorded: read again at the next poll.
			w.log.Debug("file changed", "a file changed while it was read", "error", err)
			return nil
		}
		src.settle.Loaded(stamp)
	}
	rejectKey, loadedKey := "rejected "+src.what, "loaded "+src.what
	if err != nil {
		if first {
			src.rejected = true
			return err
		}
		if !src.rejected {
			w.log.Forget(rejectKey)
		}
		src.rejected = true
		w.log.WarnErr(rejectKey, "rejected a control-plane file; serving the last good version", err)
		return nil
	}
	if !first {
		if src.rejected || src.troubled {
			w.log.Forget(loadedKey)
		}
		w.log.Info(loadedKey, loadedMsg, args...)
	}
	src.rejected = false
	src.troubled = w.problems(src) > 0
	return nil
}

// problems logs the mistakes of what src just loaded that load but cannot
// work as written, and returns how many there are.
func (w *fileWatcher) problems(src *source) int {
	switch src {
	case &w.profilesSrc:
		errs := w.store.ProfileNameProblems()
		for _, err := range errs {
			w.log.WarnErr("profile name", "a loaded ServiceProfile will never apply", err, "dir", w.dir)
		}
		return len(errs)
	case &w.manifestsSrc:
		errs := w.store.ManifestProblems()
		for _, err := range errs {
			w.log.WarnErr("manifest problem", "a loaded policy manifest cannot work as written", err, "dir", w.manifests)
		}
		return len(errs)
	}
	return 0
}

// WatchManifestFiles loads the Service, HTTPRoute and GRPCRoute manifests
// (*.yaml, *.yml) of dir into store for the OutboundPolicies API, then
// checks them every interval (default 1s when interval <= 0) and loads them
// again when any changed, until ctx is done, with the semantics of
// [WatchFiles]: a change is loaded once it settled for one interval; a bad
// file is logged with its file, document and field, and the store keeps
// serving the last good version. Manifests that load but cannot work as
// written ([manifest.Resources.Problems]: an AuthorizationPolicy requiring
// an authentication no file defines, a Server whose port is no container
// port of the Pods it selects) are logged at every load, the first
// included, each once per interval. Of the package's options it uses
// [WithLogger] and [WithLogInterval]. The error of the first load is
// returned, without watching.
func WatchManifestFiles(ctx context.Context, store *Store, dir string, interval time.Duration, opts ...Option) error {
	cfg := newConfig(opts)
	if interval <= 0 {
		interval = time.Second
	}
	w := newFileWatcher(store, cfg)
	w.manifests = dir
	if err := w.load(true); err != nil {
		return err
	}
	go w.run(ctx, interval)
	return nil
}
