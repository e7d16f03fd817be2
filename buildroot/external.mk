# Every package of this tree; Buildroot includes this file once per build.
include $(sort $(wildcard $(BR2_EXTERNAL_RACKBOOT_PATH)/package/*/*.mk))
