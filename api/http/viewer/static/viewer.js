// toolq's viewer: fetches each page's content with the tab's token, follows links and filter
// forms without leaving the page, and refreshes live pages when their server-sent events say
// something changed. Every page is rendered (and escaped) on the server; this script only
// inserts what the server sent, and sets text with textContent.
"use strict";

(() => {
  const TOKEN_KEY = "toolq.token";
  const main = document.getElementById("main");
  const login = document.getElementById("login");
  const loginForm = document.getElementById("login-form");
  const loginProblem = document.getElementById("login-problem");
  const tokenInput = document.getElementById("token");
  const signOut = document.getElementById("sign-out");
  const needsToken = document.body.dataset.needsToken === "true";
  const LIVE_EVENTS = [
    "progress", "text_delta", "text_discarded", "tool_call_started", "tool_call_finished",
    "final_answer", "done",
  ];

  let live = null; // the EventSource of a live page
  let refreshTimer = null;
  let loads = 0; // the newest load wins when several overlap

  const token = () => sessionStorage.getItem(TOKEN_KEY);
  const authHeaders = () => (token() ? { Authorization: "Bearer " + token() } : {});

  function contentUrl(url) {
    return "/ui/page" + url.pathname + url.search;
  }

  function showLogin(message) {
    stopLive();
    main.replaceChildren();
    login.hidden = false;
    if (signOut) signOut.hidden = true;
    loginProblem.hidden = !message;
    loginProblem.textContent = message || "";
    document.title = "Sign in · toolq";
    tokenInput.focus();
  }

  function showProblem(message) {
    stopLive();
    const problem = document.createElement("p");
    problem.className = "problem";
    problem.setAttribute("role", "alert");
    problem.textContent = message;
    main.replaceChildren(problem);
  }

  // Fetch the current address's content; replace the whole page, or only its live regions.
  async function load(url, { regionsOnly = false, focus = true } = {}) {
    const mine = ++loads;
    let response;
    try {
      response = await fetch(contentUrl(url), { headers: authHeaders(), cache: "no-store" });
    } catch (error) {
      if (mine === loads && !regionsOnly) showProblem("The server did not answer: " + error.message);
      return;
    }
    if (mine !== loads) return;
    if (response.status === 401) {
      const refused = token() !== null;
      sessionStorage.removeItem(TOKEN_KEY);
      showLogin(refused ? "The server refused that token: it is not its TOOLQ_API_TOKEN." : "");
      return;
    }
    const type = response.headers.get("Content-Type") || "";
    if (!type.startsWith("text/html")) {
      const body = await response.json().catch(() => ({}));
      showProblem(body.detail || "The server answered " + response.status + ".");
      return;
    }
    const html = await response.text();
    if (mine !== loads) return;
    login.hidden = true;
    if (signOut) signOut.hidden = !token();
    if (regionsOnly) {
      replaceRegions(html);
    } else {
      main.innerHTML = html;
      settle(focus);
    }
  }

  // After new content: title, the section in the navigation, focus, and the live stream.
  function settle(focus) {
    const page = main.querySelector(".page");
    if (page && page.dataset.title) document.title = page.dataset.title + " · toolq";
    const section = location.pathname.split("/")[1] || "batches";
    for (const link of document.querySelectorAll("nav a[data-section]")) {
      if (link.dataset.section === section) link.setAttribute("aria-current", "page");
      else link.removeAttribute("aria-current");
    }
    if (focus) {
      const heading = main.querySelector("h1");
      (heading || main).setAttribute("tabindex", "-1");
      (heading || main).focus();
    }
    startLive();
  }

  function replaceRegions(html) {
    const fresh = document.createElement("template");
    fresh.innerHTML = html;
    for (const region of fresh.content.querySelectorAll("[data-region]")) {
      const old = main.querySelector('[data-region="' + region.dataset.region + '"]');
      if (!old) continue;
      // Folded texts the reader opened stay open.
      const open = [...old.querySelectorAll("details[open][id]")].map((d) => d.id);
      old.replaceWith(region);
      for (const id of open) {
        const details = document.getElementById(id);
        if (details) details.open = true;
      }
    }
    if (!fresh.content.querySelector("[data-live]")) stopLive();
  }

  function startLive() {
    stopLive();
    const marker = main.querySelector("[data-live]");
    if (!marker) return;
    live = new EventSource(marker.dataset.live);
    const onEvent = (event) => {
      if (event.type === "done") {
        stopLive();
        refresh(0);
      } else {
        refresh(300);
      }
    };
    for (const type of LIVE_EVENTS) live.addEventListener(type, onEvent);
    live.addEventListener("error", () => {
      // Closed for good (its ticket expired, the server restarted): fetch the page again,
      // which brings a new ticket and a new stream.
      if (live && live.readyState === EventSource.CLOSED) {
        stopLive();
        refresh(2000, false);
      }
    });
  }

  function stopLive() {
    if (live) live.close();
    live = null;
  }

  // At most one refresh per ``delay``: many events in a burst cost one fetch.
  function refresh(delay, regionsOnly = true) {
    if (refreshTimer !== null) return;
    refreshTimer = setTimeout(() => {
      refreshTimer = null;
      load(new URL(location.href), { regionsOnly, focus: false });
    }, delay);
  }

  function navigate(url) {
    history.pushState(null, "", url);
    load(url);
  }

  document.addEventListener("click", (event) => {
    if (event.defaultPrevented || event.button !== 0) return;
    if (event.metaKey || event.ctrlKey || event.shiftKey || event.altKey) return;
    const link = event.target.closest("a[href]");
    if (!link || link.target || link.hasAttribute("download")) return;
    const url = new URL(link.href, location.href);
    if (url.origin !== location.origin || /^\/(ui|v1)\//.test(url.pathname)) return;
    if (url.pathname === location.pathname && url.search === location.search && url.hash) return;
    event.preventDefault();
    navigate(url);
  });

  document.addEventListener("submit", (event) => {
    const form = event.target;
    if (!form.hasAttribute("data-nav")) return;
    event.preventDefault();
    const url = new URL(form.getAttribute("action"), location.href);
    const params = new URLSearchParams();
    for (const [name, value] of new FormData(form)) if (value !== "") params.append(name, value);
    url.search = params.toString();
    navigate(url);
  });

  loginForm.addEventListener("submit", (event) => {
    event.preventDefault();
    const value = tokenInput.value.trim();
    if (!value) return;
    sessionStorage.setItem(TOKEN_KEY, value);
    tokenInput.value = "";
    load(new URL(location.href));
  });

  if (signOut) {
    signOut.addEventListener("click", () => {
      sessionStorage.removeItem(TOKEN_KEY);
      showLogin("");
    });
  }

  window.addEventListener("popstate", () => load(new URL(location.href)));

  if (main.dataset.loaded === "true") {
    settle(false); // the server put the content in the page: no token to ask for
  } else if (needsToken && !token()) {
    showLogin("");
  } else {
    login.hidden = true;
    load(new URL(location.href), { focus: false });
  }
})();
