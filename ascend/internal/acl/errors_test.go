package acl

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestErrorClasses(t *testing.T) {
	for _, c := range []struct {
		lib   Library
		code  int
		class error
	}{
		{ACL, 100000, ErrInvalidArgument},
		{ACL, 200000, ErrOutOfMemory},
		{ACL, 207001, ErrOutOfMemory},
		{ACL, 507015, ErrDevice},
		{ACL, 507046, ErrDevice},
		{ACL, 107002, ErrDevice},
		{ACLNN, 161001, ErrInvalidArgument},
		{ACLNN, 161002, ErrInvalidArgument},
		{ACLNN, 561003, ErrKernelMissing},
		{ACLNN, 361001, ErrDevice},
		{HCCL, 24, ErrOutOfMemory},
		{HCCL, 1, ErrInvalidArgument},
		{HCCL, 3, ErrOutOfMemory},
		{HCCL, 4, nil},
		{HCCL, 18, ErrDevice},
		{ACL, 500000, nil},
		{ACLNN, 561000, nil},
	} {
		err := error(&Error{API: "f", Lib: c.lib, Code: c.code, Msg: "m"})
		for _, class := range []error{ErrInvalidArgument, ErrOutOfMemory, ErrKernelMissing, ErrDevice} {
			assert.Equal(t, class == c.class, errors.Is(err, class), "%v %d is %v", c.lib, c.code, class)
		}
	}
	err := &Error{API: "aclrtMalloc", Lib: ACL, Code: 207001, Msg: "no room"}
	assert.Equal(t, "ascend: aclrtMalloc: ACL error 207001 (out of memory): no room", err.Error())
}
