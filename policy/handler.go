package policy

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
)

// HandlerOptions configure NewHandler.
type HandlerOptions struct {
	// Check, when set, must accept a document before it is published (for
	// example httplimit.CheckPolicy(ns)).
	Check func(*Snapshot) error
	// Logger receives a line per publish and rollback. Default
	// slog.Default().
	Logger *slog.Logger
}

// NewHandler returns an http.Handler for operators over store. Mount it
// behind your own authentication, with http.StripPrefix:
//
//	GET  /              the current document; its version in Policy-Version
//	GET  /versions      {"current": n, "versions": [1, 2, ...]}
//	GET  /versions/{n}  version n's document
//	PUT  /              publish the body as a new version (validated first):
//	                    201 {"version": n}, or 422 with the errors
//	POST /rollback      make the previous version current, or ?to=n:
//	                    200 {"version": n}
//
// Errors are RFC 9457 problem reports; a refused document's report lists
// every problem with its line, rule and field.
func NewHandler(store Store, opts HandlerOptions) http.Handler {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	h := &handler{store: store, opts: opts}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", h.current)
	mux.HandleFunc("GET /versions", h.versions)
	mux.HandleFunc("GET /versions/{n}", h.version)
	mux.HandleFunc("PUT /{$}", h.publish)
	mux.HandleFunc("POST /rollback", h.rollback)
	return mux
}

type handler struct {
	store Store
	opts  HandlerOptions
}

// Problem is the body of the handler's error answers (RFC 9457).
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	// Errors lists a refused document's problems.
	Errors []ErrorJSON `json:"errors,omitempty"`
}

// ErrorJSON is an *Error in a Problem.
type ErrorJSON struct {
	Line    int    `json:"line,omitempty"`
	Rule    string `json:"rule,omitempty"`
	Field   string `json:"field"`
	Message string `json:"message"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	ct := "application/json"
	if _, ok := v.(Problem); ok {
		ct = "application/problem+json"
	}
	w.Header().Set("Content-Type", ct)
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func problem(w http.ResponseWriter, status int, err error) {
	p := Problem{Type: "about:blank", Title: http.StatusText(status), Status: status, Detail: err.Error()}
	for _, e := range Errors(err) {
		p.Errors = append(p.Errors, ErrorJSON{Line: e.Line, Rule: e.Rule, Field: e.Field, Message: e.Msg})
	}
	writeJSON(w, status, p)
}

func storeStatus(err error) int {
	switch {
	case errors.Is(err, ErrNoVersion):
		return http.StatusNotFound
	case errors.Is(err, ErrInvalid):
		return http.StatusUnprocessableEntity
	}
	return http.StatusServiceUnavailable
}

func (h *handler) current(w http.ResponseWriter, r *http.Request) {
	n, err := h.store.Current(r.Context())
	if err != nil {
		problem(w, storeStatus(err), err)
		return
	}
	if n == 0 {
		problem(w, http.StatusNotFound, errors.New("no policy has been published"))
		return
	}
	h.serveVersion(w, r, n)
}

func (h *handler) serveVersion(w http.ResponseWriter, r *http.Request, n int64) {
	v, err := h.store.Get(r.Context(), n)
	if err != nil {
		problem(w, storeStatus(err), err)
		return
	}
	w.Header().Set("Policy-Version", strconv.FormatInt(v.Number, 10))
	w.Header().Set("Content-Type", "application/yaml")
	_, _ = w.Write(v.Doc)
}

func (h *handler) versions(w http.ResponseWriter, r *http.Request) {
	n, err := h.store.Current(r.Context())
	if err != nil {
		problem(w, storeStatus(err), err)
		return
	}
	vs, err := h.store.Versions(r.Context())
	if err != nil {
		problem(w, storeStatus(err), err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"current": n, "versions": vs})
}

func (h *handler) version(w http.ResponseWriter, r *http.Request) {
	n, err := strconv.ParseInt(r.PathValue("n"), 10, 64)
	if err != nil || n < 1 {
		problem(w, http.StatusBadRequest, fmt.Errorf("bad version %q", r.PathValue("n")))
		return
	}
	h.serveVersion(w, r, n)
}

func (h *handler) publish(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxDocumentSize))
	if err != nil {
		problem(w, http.StatusRequestEntityTooLarge, err)
		return
	}
	n, err := Publish(r.Context(), h.store, body, h.opts.Check)
	if err != nil {
		h.opts.Logger.Warn("policy: publish refused", "error", err)
		problem(w, storeStatus(err), err)
		return
	}
	h.opts.Logger.Info("policy: published", "version", n)
	writeJSON(w, http.StatusCreated, map[string]int64{"version": n})
}

func (h *handler) rollback(w http.ResponseWriter, r *http.Request) {
	var n int64
	var err error
	if to := r.URL.Query().Get("to"); to != "" {
		n, err = strconv.ParseInt(to, 10, 64)
		if err != nil || n < 1 {
			problem(w, http.StatusBadRequest, fmt.Errorf("bad version %q", to))
			return
		}
		err = h.rollbackTo(r, n)
	} else {
		n, err = Rollback(r.Context(), h.store)
	}
	if err != nil {
		problem(w, storeStatus(err), err)
		return
	}
	h.opts.Logger.Info("policy: rolled back", "version", n)
	writeJSON(w, http.StatusOK, map[string]int64{"version": n})
}

// rollbackTo makes n current after checking it still compiles (a Check may
// have changed since it was published).
func (h *handler) rollbackTo(r *http.Request, n int64) error {
	v, err := h.store.Get(r.Context(), n)
	if err != nil {
		return err
	}
	s, err := Load(v.Doc, n, Options{})
	if err == nil && h.opts.Check != nil {
		err = h.opts.Check(s)
	}
	if err != nil {
		return err
	}
	return h.store.SetCurrent(r.Context(), n)
}
