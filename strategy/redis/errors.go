package redis

import (
	"errors"
	"net"
	"strings"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratesync/ratelimit/strategy"
)

// refusals are the error codes with which Redis refuses a command before it
// runs it. Inside a script they can only come from its first write (the
// push script's SET NX of the batch-part id; the take script's first write,
// whichever it is: Redis checks OOM, READONLY, MISCONF and NOREPLICAS at a
// script's first write and lets the rest of the script run), so they too
// mean that the script wrote nothing.
var refusals = map[string]bool{
	"NOSCRIPT": true, "READONLY": true, "LOADING": true, "MASTERDOWN": true,
	"BUSY": true, "CLUSTERDOWN": true, "TRYAGAIN": true, "CROSSSLOT": true,
	"OOM": true, "MISCONF": true, "NOREPLICAS": true, "NOAUTH": true,
	"NOPERM": true, "WRONGPASS": true, "MOVED": true, "ASK": true,
}

func isRedisError(err error) bool {
	var rerr goredis.Error
	return errors.As(err, &rerr)
}

func isNoScript(err error) bool {
	return errors.Is(err, goredis.ErrNoScript) || goredis.HasErrorPrefix(err, "NOSCRIPT")
}

// mayHaveRetried reports whether the client may make several attempts at a
// command, so that a reply proves nothing about the attempts before it.
func (s *Store) mayHaveRetried() bool { return !s.noRetries }

// surelyNotApplied reports whether err, the error of one script call, proves
// that the call wrote nothing.
//
// A refusal from Redis (a reply such as LOADING or READONLY) proves that the
// attempt it answers ran nothing; and so does a connection that could not be
// had. Neither proves anything about the command as a whole when the client
// may have made several attempts: an earlier attempt may have been applied
// and lost its reply before a retry was refused (go-redis retries LOADING,
// READONLY, MASTERDOWN, TRYAGAIN, CLUSTERDOWN and lost connections by
// default). So only a single-attempt client gets a "not applied" verdict.
func (s *Store) surelyNotApplied(err error) bool {
	if errors.Is(err, strategy.ErrNotApplied) {
		return true // never sent: decided before any attempt
	}
	if s.mayHaveRetried() {
		return false
	}
	var rerr goredis.Error
	if errors.As(err, &rerr) {
		msg := rerr.Error()
		if strings.HasPrefix(msg, "ERR max number of clients reached") {
			return true
		}
		code, _, _ := strings.Cut(msg, " ")
		return refusals[code]
	}
	var op *net.OpError
	return (errors.As(err, &op) && op.Op == "dial") ||
		errors.Is(err, goredis.ErrPoolTimeout) || errors.Is(err, goredis.ErrClosed)
}
