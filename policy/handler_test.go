package policy_test

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/policy"
	"github.com/ratesync/ratelimit/policy/storetest"
)

func TestHandler(t *testing.T) {
	store := policy.NewMemoryStore()
	h := http.StripPrefix("/admin/policy", policy.NewHandler(store, policy.HandlerOptions{Logger: slog.New(slog.DiscardHandler)}))
	do := func(method, path, body string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(method, path, strings.NewReader(body)))
		return w
	}
	require.Equal(t, http.StatusNotFound, do("GET", "/admin/policy/", "").Code)

	w := do("PUT", "/admin/policy/", string(storetest.Doc(10)))
	require.Equal(t, http.StatusCreated, w.Code)
	require.JSONEq(t, `{"version": 1}`, w.Body.String())
	require.Equal(t, http.StatusCreated, do("PUT", "/admin/policy/", string(storetest.Doc(20))).Code)

	w = do("GET", "/admin/policy/", "")
	require.Equal(t, http.StatusOK, w.Code)
	require.Equal(t, "2", w.Header().Get("Policy-Version"))
	require.Equal(t, string(storetest.Doc(20)), w.Body.String())

	// A bad document is refused with every problem placed.
	w = do("PUT", "/admin/policy/", "rules:\n  - id: a\n    match: {route: /a}\n    limits: [{window: 1m, max: 0}]\n    bogus: 1\n")
	require.Equal(t, http.StatusUnprocessableEntity, w.Code)
	require.Equal(t, "application/problem+json", w.Header().Get("Content-Type"))
	var p policy.Problem
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &p))
	require.Equal(t, []policy.ErrorJSON{
		{Line: 5, Rule: "a", Field: "rules[0].bogus", Message: "field bogus is unknown in Rule"},
		{Line: 4, Rule: "a", Field: "rules[0].limits[0].max", Message: "0 would reject all traffic: want at least 1"},
	}, p.Errors)

	w = do("GET", "/admin/policy/versions", "")
	require.JSONEq(t, `{"current": 2, "versions": [1, 2]}`, w.Body.String())
	require.Equal(t, string(storetest.Doc(10)), do("GET", "/admin/policy/versions/1", "").Body.String())
	require.Equal(t, http.StatusNotFound, do("GET", "/admin/policy/versions/9", "").Code)
	require.Equal(t, http.StatusBadRequest, do("GET", "/admin/policy/versions/x", "").Code)

	w = do("POST", "/admin/policy/rollback", "")
	require.Equal(t, http.StatusOK, w.Code)
	require.JSONEq(t, `{"version": 1}`, w.Body.String())
	require.Equal(t, http.StatusNotFound, do("POST", "/admin/policy/rollback", "").Code, "nothing before 1")
	w = do("POST", "/admin/policy/rollback?to=2", "")
	require.JSONEq(t, `{"version": 2}`, w.Body.String())
	require.Equal(t, http.StatusNotFound, do("POST", "/admin/policy/rollback?to=7", "").Code)
	require.Equal(t, http.StatusMethodNotAllowed, do("DELETE", "/admin/policy/", "").Code)
}
