package ratefields

import (
	"errors"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/policy"
)

// CheckPolicyOptions checks the options that httplimit's and grpclimit's
// NewWithPolicy share: the policy p is required, and the limits, the number
// of rules and the cost of the embedded Options must be empty, since the
// policy gives them. Its error starts with prefix, the package's name, then
// names the PolicyOptions field at fault.
func CheckPolicyOptions(prefix string, p policy.Provider, limits []ratelimit.Limit, rules int, cost int64) error {
	switch {
	case p == nil:
		return errors.New(prefix + ": PolicyOptions.Policy is required")
	case len(limits) > 0 || rules > 0 || cost != 0:
		return errors.New(prefix + ": PolicyOptions: Limits, Rules and Cost come from the policy and must be empty")
	}
	return nil
}
