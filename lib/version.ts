/** The k3 release. */
export const VERSION = "0.1.0";
