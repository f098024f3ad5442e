/* String forms of the API's enums. */
#include "kvcr/kvcr.h"
#include "util/api.h"

KVCR_API const char *kvcr_tier_name(kvcr_tier tier)
{
    switch (tier) {
    case KVCR_TIER_FW_G1: return "HBM";
    case KVCR_TIER_FW_G2: return "FW_DRAM";
    case KVCR_TIER_LOCAL_G2: return "DRAM";
    case KVCR_TIER_REMOTE_G2: return "REMOTE_G2";
    case KVCR_TIER_G3: return "G3";
    default: return "";
    }
}

KVCR_API const char *kvcr_query_status_name(kvcr_query_status status)
{
    switch (status) {
    case KVCR_QUERY_MISS: return "MISS";
    case KVCR_QUERY_HIT: return "HIT";
    case KVCR_QUERY_FETCHING: return "FETCHING";
    case KVCR_QUERY_FETCHABLE: return "FETCHABLE";
    default: return "";
    }
}

KVCR_API const char *kvcr_entry_status_name(kvcr_entry_status status)
{
    switch (status) {
    case KVCR_ENTRY_SUCCESS: return "SUCCESS";
    case KVCR_ENTRY_DROPPED: return "DROPPED";
    case KVCR_ENTRY_FAILED: return "FAILED";
    default: return "";
    }
}

KVCR_API const char *kvcr_reason_name(kvcr_reason reason)
{
    switch (reason) {
    case KVCR_REASON_NONE: return "NONE";
    case KVCR_REASON_TIMEOUT: return "TIMEOUT";
    case KVCR_REASON_ABORTED: return "ABORTED";
    case KVCR_REASON_NO_CAPACITY: return "NO_CAPACITY";
    case KVCR_REASON_NOT_FOUND: return "NOT_FOUND";
    case KVCR_REASON_TRANSFER_ERROR: return "TRANSFER_ERROR";
    case KVCR_REASON_LAYOUT_MISMATCH: return "LAYOUT_MISMATCH";
    case KVCR_REASON_DISCARDING: return "DISCARDING";
    case KVCR_REASON_NO_LOCAL_DRAM: return "NO_LOCAL_DRAM";
    case KVCR_REASON_CLOSED: return "CLOSED";
    case KVCR_REASON_POLICY: return "POLICY";
    case KVCR_REASON_CORRUPT: return "CORRUPT";
    case KVCR_REASON_SOURCE_BUSY: return "SOURCE_BUSY";
    default: return "";
    }
}
